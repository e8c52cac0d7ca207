"""A full crash: every process of a running system killed at once, then started again
with the README's command, `python -m webapp.start`.

The system runs from a folder of its own (tests/system/whole_system.py) so that it
shares nothing with the machine or the other tests. Every wait polls a condition with
a deadline.
"""

from __future__ import annotations

import json

import pytest
import redis

from tests.fixtures import wait_until
from tests.system.whole_system import TINY, TOKENS, alive, crash

# The system under test has a database of its own: `make test-system` runs it once.
pytestmark = [pytest.mark.integration, pytest.mark.system]

def test_a_full_crash_loses_no_acknowledged_merge_and_the_run_finishes(system, tmp_path):
    config = {**TINY, "data": {"path": str(tmp_path / "corpus.txt")}}
    system.django(f"""
from webapp.runs.lifecycle import create_run
create_run(name="demo", mode="decoupled", config={config!r}, user=None)
print(json.dumps(True))""")
    first = system.start()
    run_id = system.django("""
from webapp.runs.lifecycle import start_run
run = Run.objects.get(name="demo"); start_run(run, by=None); print(json.dumps(run.pk))""")
    client = redis.Redis.from_url(system.redis_url())

    def versions() -> dict[int, int]:
        return {int(k): int(v) for k, v in client.hgetall(f"arch:{run_id}:versions").items()}

    wait_until(lambda: len(versions()) == 2 and min(versions().values()) >= 3, 240,
               "three published versions of each fragment", first)
    # Every version Redis has published is an acknowledged merge.
    pids, acknowledged = crash(first, versions)
    wait_until(lambda: not [pid for pid in pids if alive(pid)], 10,
               "every process of the system to be gone")
    client.close()

    system.start()
    client = redis.Redis.from_url(system.redis_url())
    versions_after_crash = versions()  # what Redis read back from its append-only file
    assert "goes on: its islands start again" in system.output()
    assert versions_after_crash, "the published versions did not survive the crash"

    # Every acknowledged merge the run had is still there, and the run goes on from it.
    assert all(versions_after_crash[p] >= v for p, v in acknowledged.items()), \
        (acknowledged, versions_after_crash)

    def state() -> dict:
        return system.django(f"""
run = Run.objects.get(pk={run_id})
print(json.dumps({{"state": run.state, "tokens": run.tokens,
  "epochs": dict(run.islands.values_list("name", "epoch")),
  "lost": [e.detail for e in run.events.filter(kind="alert")
           if e.detail.get("lost_interval")]}}))""")

    resumed = state()
    assert all(epoch == 2 for epoch in resumed["epochs"].values()), resumed
    assert len(resumed["lost"]) == 1
    interval = resumed["lost"][0]["lost_interval"]
    assert 0 <= interval["seconds"] < 600 and interval["from"] < interval["until"]

    def beats() -> dict:
        raw = client.hgetall(f"arch:{run_id}:heartbeats")
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    wait_until(lambda: all(b.get("epoch") == 2 and b.get("state") in ("training", "stopped")
                           for b in beats().values()), 180,
               "the islands' second epochs to train", system.process)
    done = wait_until(lambda: (s := state())["state"] == "completed" and s, 300,
                      "the run to complete after the crash", system.process)
    assert done["tokens"] >= TOKENS
    final = versions()
    assert all(final[p] >= v for p, v in versions_after_crash.items())
