"""A full crash: every process of a running system killed at once, then started again
with the README's command, `python -m webapp.start`.

The system runs from a folder of its own (VAR_DIR, its own SQLite database,
checkpoints and logs; start.py's embedded Redis with its append-only file, on a
free port) so that it shares nothing with the machine or the other tests. Every
wait polls a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from trainer.launch import free_port

# The system under test has a database of its own: `make test-system` runs it once.
pytestmark = [pytest.mark.integration, pytest.mark.system]
ROOT = Path(__file__).resolve().parents[2]
TOKENS = 40_000


def wait_until(condition: Callable[[], object], timeout: float, what: str,
               system: subprocess.Popen | None = None) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if system is not None and system.poll() is not None:
            raise AssertionError(f"python -m webapp.start exited ({system.returncode}) "
                                 f"while waiting for {what}")
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (Celery pools, island processes...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def is_redis(pid: int) -> bool:
    try:
        return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def crash(system: subprocess.Popen, frozen: Callable[[], object] = lambda: None
          ) -> tuple[list[int], object]:
    """kill -9 of the whole system at once: its processes frozen first (SIGSTOP), so
    nothing sees another die and reacts, then every one SIGKILLed.

    Redis is not frozen: `frozen` is called while everything else stands still, so
    what it reads from Redis is every merge the system ever acknowledged.
    Returns the pids and what `frozen` returned.
    """
    pids: list[int] = []
    for _ in range(2):  # twice: anything forked while the first pass froze the rest
        pids = sorted(set(pids) | {system.pid, *descendants(system.pid)})
        for pid in pids:
            if not is_redis(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
    seen = frozen()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    system.wait(timeout=10)
    return pids, seen


class System:
    """`python -m webapp.start` with its own folder, port and database."""

    def __init__(self, home: Path):
        self.home = home
        self.env = {**os.environ, "VAR_DIR": str(home / "var"),
                    "DATABASE_URL": f"sqlite:///{home / 'db.sqlite3'}",
                    "CHECKPOINT_DIR": str(home / "checkpoints"), "LOG_DIR": str(home / "logs"),
                    "PORT": str(free_port()), "ISLANDS_PER_WORKER": "3",
                    "SYNCD_LEASE_TTL_S": "5", "REGIONS": "us-east,us-west",
                    "DJANGO_SETTINGS_MODULE": "webapp.settings", "PYTHONPATH": str(ROOT),
                    "PYTHONUNBUFFERED": "1"}
        for name in ("REDIS_URL", "DJANGO_ALLOW_ASYNC_UNSAFE"):
            self.env.pop(name, None)
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> subprocess.Popen:
        self.starts += 1
        log = open(self.home / f"start-{self.starts}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen([sys.executable, "-m", "webapp.start"], cwd=ROOT,
                                        env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        wait_until(lambda: "Archipelago is running" in self.output(), 180,
                   "python -m webapp.start to be up", self.process)
        return self.process

    def output(self) -> str:
        return (self.home / f"start-{self.starts}.log").read_text(errors="replace")

    def django(self, code: str) -> object:
        """Run code against the system's database; it prints one JSON value."""
        script = ("import django, json; django.setup()\n"
                  "from webapp.runs.models import Run, Event, Island\n" + code)
        env = dict(self.env)
        if (self.home / "var" / "redis" / "port").exists():
            env["REDIS_URL"] = self.redis_url()
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{(self.home / 'var' / 'redis' / 'port').read_text()}/0"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                crash(self.process)


@pytest.fixture
def system(tmp_path):
    system = System(tmp_path)
    (tmp_path / "corpus.txt").write_text("".join(
        f"line {i}: the islands train and the merge goes on.\n" for i in range(4000)))
    # A tiny run named "demo" in the system's database, so that the start makes no
    # demo of its own and the run finishes in a minute or two; started once up.
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT,
                   env=system.env, check=True, timeout=300)
    yield system
    system.stop()


TINY = {
    "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
    "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2,
             "max_staleness": 8},
    "eval": {"tokens": 256}, "liveness": {"heartbeat_timeout_s": 4.0},
    "checkpoint": {"interval_s": 5.0}, "budget": {"total_tokens": TOKENS},
    "islands": [{"name": f"island-{i}", "region": region, "batch_size": 2, "speed": 0.5}
                for i, region in enumerate(("us-east", "us-east", "us-west"))],
}


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
