"""Island logs: one file per run and island on the host that runs it.

The supervisor writes the island's output there and ships its last lines to
Redis, so the control room shows them whatever host the island runs on.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path


def island_log_path(log_dir: str | Path, run_id: int | str, island: str) -> Path:
    """Where an island's log lives: <log_dir>/run-<id>/<island>.log, whatever the name holds."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", island).lstrip(".")
    if safe != island or not safe:
        # Two names that differ only in unsafe characters still get two files.
        safe = f"{safe}-{hashlib.sha1(island.encode()).hexdigest()[:8]}"
    return Path(log_dir) / f"run-{run_id}" / f"{safe}.log"


def tail_lines(path: str | Path, lines: int = 50, block: int = 8192) -> list[str]:
    """The last `lines` lines of a text file, read from its end; [] if it does not exist."""
    if lines <= 0:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = pos = f.tell()
            data = b""
            while pos > 0 and data.count(b"\n") <= lines:
                pos = max(0, pos - block)
                f.seek(pos)
                data = f.read(end - pos)
    except FileNotFoundError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]
