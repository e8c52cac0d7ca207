"""One benchmark at a time on a machine: two at once share its cores and make both
figures wrong. `python -m bench` holds an exclusive lock on a file of the system's
temporary folder for a benchmark's whole run; a second one waits, saying for which."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "archipelago-bench.lock"


def holder(lock: Path = LOCK) -> str | None:
    """Which benchmark holds the machine (its name and pid), None if none does."""
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            return f.read().strip() or "unknown"
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


@contextlib.contextmanager
def alone(what: str, lock: Path = LOCK) -> Iterator[None]:
    """Hold the machine for the benchmark `what`, waiting (and saying so) while another
    holds it; the lock goes with the process, however it ends."""
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            print(f"Waiting for the benchmark running on this machine to finish "
                  f"({f.read().strip() or 'unknown'}): two at once would share its cores.",
                  flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.truncate(0)
        f.write(f"{what}, pid {os.getpid()}")
        f.flush()
        yield
