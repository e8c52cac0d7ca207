"""`python -m webapp.start` stops cleanly: everything within 10 s of a SIGTERM, the
islands finishing their step and saving their cursors first, and nothing left
behind when it is SIGKILLed, as a process manager does 5 s after its SIGTERM.

Each test runs a whole system of its own (tests/system/whole_system.py) with a tiny run
training; every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis

from tests.fixtures import wait_until
from tests.system.whole_system import TINY, System, alive, descendants

pytestmark = [pytest.mark.integration, pytest.mark.system]
STOP_WITHIN_S = 10.0


def training(system: System, tmp_path) -> list[int]:
    """Start the system with a tiny run named demo, wait until its islands train, and
    return every process the start started (the guard, Redis, the web app, syncd,
    the workers, their pool processes and the islands)."""
    config = {**TINY, "data": {"path": str(tmp_path / "corpus.txt")}}
    system.django(f"""
from webapp.runs.lifecycle import create_run
create_run(name="demo", mode="decoupled", config={config!r}, user=None)
print(json.dumps(True))""")
    start = system.start()
    run_id = system.django("""
from webapp.runs.lifecycle import start_run
run = Run.objects.get(name="demo"); start_run(run, by=None); print(json.dumps(run.pk))""")
    client = redis.Redis.from_url(system.redis_url())

    def all_train() -> bool:
        beats = client.hvals(f"arch:{run_id}:heartbeats")
        return [json.loads(b).get("state") for b in beats] == ["training"] * len(TINY["islands"])

    wait_until(all_train, 240, "every island to train", process=start)
    client.close()
    return descendants(start.pid)


def islands_ended(system: System) -> list[str]:
    """The last line of each island's log: how its supervisor saw it end."""
    return [path.read_text().splitlines()[-1].split("] ", 1)[1]
            for path in sorted((system.home / "logs").glob("run-*/*.log"))]


def test_sigterm_stops_everything_within_10_s_and_the_islands_stop_cleanly(system, tmp_path):
    pids = training(system, tmp_path)
    start = system.process

    started = time.monotonic()
    start.send_signal(signal.SIGTERM)
    start.wait(timeout=60)
    took = time.monotonic() - started

    assert start.returncode == 0
    assert took < STOP_WITHIN_S, f"the stop took {took:.1f} s"
    assert not [pid for pid in pids if alive(pid)]
    # Each island finished its step, saved its cursor and exited 0; none was killed.
    assert islands_ended(system) == ["epoch 1 ended (stopped), exit code 0"] * 3
    assert "redis: exit code 0" in system.output()


def test_a_start_killed_with_sigkill_leaves_no_process_behind(system, tmp_path):
    pids = training(system, tmp_path)

    system.process.kill()
    system.process.wait(timeout=10)

    wait_until(lambda: not [pid for pid in pids if alive(pid)], STOP_WITHIN_S + 5,
               "every process the start started to be gone")
    assert islands_ended(system) == ["epoch 1 ended (stopped), exit code 0"] * 3
