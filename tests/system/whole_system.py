"""A whole system of its own for the scenario tests: `python -m webapp.start` run from a
folder of its own (VAR_DIR, its own SQLite database, checkpoints and logs; start.py's
embedded Redis with its append-only file, on a free port) so that it shares nothing
with the machine or the other tests; the tiny run it trains; a kill -9 of it all; and
waits that poll a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.fixtures import wait_until
from trainer.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 40_000


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Celery pools, island processes...)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


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
        for name in ("REDIS_URL", "DATAPLANE_REDIS_URL", "DJANGO_ALLOW_ASYNC_UNSAFE"):
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
                   "python -m webapp.start to be up", process=self.process)
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
        if (self.home / "var" / "dataplane" / "port").exists():
            env["DATAPLANE_REDIS_URL"] = self.redis_url("dataplane")
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    def redis_url(self, name: str = "redis") -> str:
        """The URL of the start's control Redis, or with "dataplane" its data plane's."""
        return f"redis://127.0.0.1:{(self.home / 'var' / name / 'port').read_text()}/0"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                crash(self.process)




TINY = {
    "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
    "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2,
             "max_staleness": 8},
    "eval": {"tokens": 256}, "liveness": {"heartbeat_timeout_s": 4.0},
    "checkpoint": {"interval_s": 5.0}, "budget": {"total_tokens": TOKENS},
    "islands": [{"name": f"island-{i}", "region": region, "batch_size": 2, "speed": 0.5}
                for i, region in enumerate(("us-east", "us-east", "us-west"))],
}

