"""Fakes for the island supervisor's tests: a store that stands in for Redis and
training loops in miniature, as child processes."""

from pathlib import Path

import redis

from tests.fixtures import python
from trainer.supervisor import IslandSupervisor

POLL_S = 0.02


# A training loop in miniature: says it is ready, then works; on SIGTERM it finishes
# ("saves its cursor") and exits 0.
GRACEFUL = python("""
    import signal, sys, time
    def stop(*_):
        print("cursor saved", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while True:
        time.sleep(0.01)
""")
STUBBORN = python("""
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(60)
""")


class FakeStore:
    """Commands and epochs of one island, as RunStore gives them.

    Commands are handed out only once `ready()` is true (the child said "ready"),
    so a test never races the child's start.
    """

    def __init__(self, commands=(), epochs=None, ready=lambda: True):
        self.commands = list(commands)
        self.epochs_ = dict(epochs or {})
        self.ready = ready
        self.sent_back = []
        self.failures = 0
        self.logs = []
        self.deaths = []
        self.signals = self  # the island signals' part of a RunStore

    def next_command(self, island):
        if self.failures:
            self.failures -= 1
            raise redis.ConnectionError("Redis is away")
        if not self.ready() or not self.commands:
            return None
        return self.commands.pop(0)

    def send_command(self, island, kind, **args):
        self.sent_back.append({"kind": kind, **args})

    def epochs(self):
        return dict(self.epochs_)

    def put_log(self, island, lines):
        self.logs.append(lines)

    def report_death(self, island, epoch, exit_code, at=None):
        self.deaths.append({"island": island, "epoch": epoch, "exit_code": exit_code,
                            "at": at})


def says(log: Path, line: str):
    """Whether the child wrote `line` (a whole line: the supervisor's notes quote the code)."""
    return lambda: log.exists() and line in log.read_text().splitlines()


def process_state(pid: int) -> str:
    """R, S, T (stopped), Z...; '' once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


def supervisor(tmp_path, command, store, epoch=1, **kwargs):
    return IslandSupervisor(command, store, "island-0", epoch, tmp_path / "island-0.log",
                            poll_s=POLL_S, **kwargs)
