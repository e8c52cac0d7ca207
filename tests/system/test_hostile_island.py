"""One island's own credential against a whole system (issue #47), in the system tier.

`python -m webapp.start` trains two runs; as the real island user of one (syncd/acl.py,
both planes, the password a launcher hands its islands), every write command it holds
is sent with hostile values to every key pattern it may write
(tests/syncd/test_hostile_island.py's calls), then floods of what syncd bounds
(syncd/key_bounds.py): heartbeat fields and cursors of no island, chunks without a TTL.
Both runs keep merging (3 versions more each within 90 s of the attack's end: the
attacked run's islands survive the keys it left of another type, syncd.run_keys
.RunKeys.own_write) and syncd's RSS grows by no more than the syncd estimate of the
two runs (diloco.sizes.estimate, what the admission counts) and SLACK_MB of the
interpreter's own heap, which the estimate leaves out.
"""

from __future__ import annotations

import json

import psutil
import pytest
import redis

from diloco.config_parse import parse_config
from diloco.signing import redis_password
from diloco.sizes import estimate
from syncd.acl import island_store, island_url
from syncd.keys import ISLAND_WRITES
from tests.fixtures import wait_until
from tests.syncd.test_hostile_island import hostile_calls
from tests.system.whole_system import TINY, descendants

pytestmark = [pytest.mark.integration, pytest.mark.system]
SLACK_MB = 64
WINDOW_S = 90


def attack(control_url: str, data_url: str, run_id: int, secret: str) -> int:
    """Every hostile call on every key islands write, then the floods; the calls taken."""
    password = redis_password(bytes.fromhex(secret))
    island = island_store(island_url(control_url, run_id, password),
                          island_url(data_url, run_id, password), run_id)
    taken = 0
    for writer in (island.writer, island.data_writer):
        for part in ISLAND_WRITES:
            key = f"arch:{run_id}:{part.replace('*', 'island-0:1:0:10')}"
            for call in hostile_calls(key):
                try:
                    writer.execute_command(*call)
                    taken += 1
                except redis.ResponseError:
                    pass  # WRONGTYPE: the key holds another type now
            writer.delete(key)
    island.writer.hset(f"arch:{run_id}:heartbeats",
                       mapping={f"junk-{i}": "x" * 200 for i in range(20_000)})
    for i in range(500):
        island.writer.set(f"arch:{run_id}:cursor:junk-{i}", "x" * 2000)
        island.data_writer.set(f"arch:{run_id}:blob:junk:1:0:{i}:0", "x" * 2000)
    return taken


def command_line(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # gone meanwhile
        return []


def test_one_islands_credential_stops_neither_its_run_nor_a_bystander(system, tmp_path):
    config = {**TINY, "data": {"path": str(tmp_path / "corpus.txt")},
              "budget": {"total_tokens": 10**9}}
    system.django(f"""
from webapp.runs.lifecycle import create_run
for name in ("demo", "bystander"):
    create_run(name=name, mode="decoupled", config={config!r}, user=None)
print(json.dumps(True))""")
    start = system.start()
    runs = system.django("""
from webapp.runs.lifecycle import start_run
found = {}
for run in Run.objects.order_by("id"):
    start_run(run, by=None)
    found[run.name] = [run.pk, run.secret]
print(json.dumps(found))""")
    client = redis.Redis.from_url(system.redis_url())

    def version(name: str) -> int:
        found = client.hvals(f"arch:{runs[name][0]}:versions")
        return min(int(v) for v in found) if len(found) == 2 else 0

    wait_until(lambda: version("demo") >= 1 and version("bystander") >= 1, 240,
               "a version of each fragment of both runs", process=start)
    [syncd] = [process for process in map(psutil.Process, descendants(start.pid))
               if "syncd" in " ".join(command_line(process))]
    rss_before = syncd.memory_info().rss
    before = {name: version(name) for name in runs}

    assert attack(system.redis_url(), system.redis_url("dataplane"), *runs["demo"]) > 0
    attacked = {name: version(name) for name in runs}
    peak = [rss_before]

    seen: dict = {}

    def both_merged_and_bounded() -> bool:
        peak.append(syncd.memory_info().rss)
        seen.update({name: version(name) for name in runs},
                    heartbeats=client.hlen(f"arch:{runs['demo'][0]}:heartbeats"))
        return all(seen[name] >= attacked[name] + 3 for name in runs) \
            and seen["heartbeats"] <= len(TINY["islands"])

    try:
        wait_until(both_merged_and_bounded, WINDOW_S,
                   "3 more versions of each run and the flood deleted", process=start)
    except AssertionError as e:
        logs = "".join(line for path in (tmp_path / "logs").rglob("syncd*.log")
                       for line in path.read_text().splitlines(keepends=True)
                       if "deleted" in line or "ERROR" in line or "tick" in line)
        raise AssertionError(f"{e}: before {before}, after the attack {attacked}, "
                             f"then {seen}\n{logs[-4000:]}") from e

    syncd_estimate = 2 * estimate(parse_config(config, ["us-east", "us-west"])).syncd.total
    grown = max(peak) - rss_before
    assert grown <= syncd_estimate + (SLACK_MB << 20), (grown, syncd_estimate)
    assert not client.keys(f"arch:{runs['demo'][0]}:cursor:junk-*")
    rejections = system.django(f"""
print(json.dumps(sorted({{e.detail.get("cause") for e in
    Event.objects.filter(run_id={runs['demo'][0]}, kind="rejection")}} - {{None}})))""")
    assert "heartbeat_of_no_island" in rejections, rejections
    print(json.dumps({"rss_before_mb": rss_before >> 20, "grown_mb": grown / 2**20,
                      "syncd_estimate_kb": syncd_estimate >> 10, "before": before,
                      "after_attack": attacked, "after": seen}))
