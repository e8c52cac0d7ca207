"""One island's own credential against a whole system (issue #47), in the system tier.

`python -m webapp.start` trains two runs; as the real island user of one (syncd/acl.py,
both planes, the password a launcher hands its islands), every write command it holds
is sent with hostile values to every key pattern it may write
(tests/syncd/test_hostile_island.py's calls), then floods of what syncd bounds
(syncd/key_bounds.py): heartbeat fields and cursors of no island, chunks without a TTL,
and upload tickets in the run's real islands' names (syncd.upload_slots.crowded).
Both runs keep merging (3 versions more each within 90 s of the attack's end: the
attacked run's islands survive the keys it left of another type, syncd.run_keys
.RunKeys.own_write), and syncd's RSS, sampled every RSS_EVERY_S from before the attack
to the end of that window, stays within the syncd estimate the admission counts for
the runs it serves (webapp.runs.validation.Taken over the admitted runs, its process
base once: diloco.sizes.SYNCD_BASE_BYTES).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import redis

from diloco.signing import redis_password
from syncd.acl import island_store, island_url
from syncd.keys import ISLAND_WRITES
from syncd.upload_slots import Ticket
from tests.fixtures import wait_until
from tests.syncd.test_hostile_island import hostile_calls
from tests.system.whole_system import TINY, descendants

pytestmark = [pytest.mark.integration, pytest.mark.system]
WINDOW_S = 90
RSS_EVERY_S = 0.25


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
    island.data_writer.rpush(f"arch:{run_id}:uploads", *(
        Ticket(name, epoch, fragment, 10**9 + i).encode() for i in range(200)
        for name, epoch in island.epochs().items() for fragment in (0, 1)))
    for i in range(500):
        island.writer.set(f"arch:{run_id}:cursor:junk-{i}", "x" * 2000)
        island.data_writer.set(f"arch:{run_id}:blob:junk:1:0:{i}:0", "x" * 2000)
    return taken


def command_line(pid: int) -> list[str]:
    """Process `pid`'s command line; empty if it is gone (a short-lived descendant)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:  # gone meanwhile
        return []


@contextmanager
def rss_samples(process: psutil.Process) -> Iterator[list[int]]:
    """The process's RSS every RSS_EVERY_S, in a thread, while the block runs; raises if
    the process went meanwhile (a syncd that died is no syncd within its estimate)."""
    samples = [process.memory_info().rss]
    done = threading.Event()
    gone: list[BaseException] = []

    def sample() -> None:
        while not done.wait(RSS_EVERY_S):
            try:
                samples.append(process.memory_info().rss)
            except psutil.Error as e:
                gone.append(e)
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        done.set()
        sampler.join()
    assert not gone, f"syncd went while it was sampled: {gone[0]!r}"


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
    [syncd] = [psutil.Process(pid) for pid in descendants(start.pid)
               if "syncd" in " ".join(command_line(pid))]
    syncd_estimate = system.django("""
from diloco.sizes import SYNCD_BASE_BYTES
from webapp.runs.validation import Taken, admitted_configs
print(json.dumps(SYNCD_BASE_BYTES + Taken.of(admitted_configs()).syncd))""")
    before = {name: version(name) for name in runs}
    seen: dict = {}

    def both_merged_and_bounded() -> bool:
        seen.update({name: version(name) for name in runs},
                    heartbeats=client.hlen(f"arch:{runs['demo'][0]}:heartbeats"))
        return all(seen[name] >= attacked[name] + 3 for name in runs) \
            and seen["heartbeats"] <= len(TINY["islands"])

    with rss_samples(syncd) as rss:
        assert attack(system.redis_url(), system.redis_url("dataplane"), *runs["demo"]) > 0
        attacked = {name: version(name) for name in runs}
        try:
            wait_until(both_merged_and_bounded, WINDOW_S,
                       "3 more versions of each run and the flood deleted", process=start)
        except AssertionError as e:
            raise AssertionError(f"{e}: before {before}, after the attack {attacked}, "
                                 f"then {seen}\n{syncd_log(tmp_path)}") from e

    assert max(rss) <= syncd_estimate, (max(rss), syncd_estimate)
    assert not client.keys(f"arch:{runs['demo'][0]}:cursor:junk-*")
    rejections = system.django(f"""
print(json.dumps(sorted({{e.detail.get("cause") for e in
    Event.objects.filter(run_id={runs['demo'][0]}, kind="rejection")}} - {{None}})))""")
    assert {"heartbeat_of_no_island", "tickets_crowded"} <= set(rejections), rejections
    print(json.dumps({"rss_before_mb": rss[0] >> 20, "rss_peak_mb": max(rss) >> 20,
                      "rss_samples": len(rss), "syncd_estimate_mb": syncd_estimate >> 20,
                      "before": before, "after_attack": attacked, "after": seen}))


def syncd_log(home: Path) -> str:
    """What of syncd's log says why a run stalled: deletions, errors, ticks."""
    return "".join(line for path in (home / "logs").rglob("syncd*.log")
                   for line in path.read_text().splitlines(keepends=True)
                   if "deleted" in line or "ERROR" in line or "tick" in line)[-4000:]
