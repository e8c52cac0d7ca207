"""Island logs: one file per run and island on the host that runs it.

The supervisor writes the island's output there and ships its last lines to
Redis, so the control room shows them whatever host the island runs on.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

MAX_LINE_BYTES = 2000  # the end of a longer line is what is shown of it
CUT = "[cut] …"  # what a line cut to its end starts with


def island_log_path(log_dir: str | Path, run_id: int | str, island: str) -> Path:
    """Where an island's log lives: <log_dir>/run-<id>/<island>.log, whatever the name holds."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", island).lstrip(".")
    if safe != island or not safe:
        # Two names that differ only in unsafe characters still get two files.
        safe = f"{safe}-{hashlib.sha1(island.encode()).hexdigest()[:8]}"
    return Path(log_dir) / f"run-{run_id}" / f"{safe}.log"


def tail_lines(path: str | Path, lines: int = 50, block: int = 8192,
               max_line_bytes: int = MAX_LINE_BYTES) -> list[str]:
    """The last `lines` lines of a text file, read from its end; [] if it does not exist.

    Each block is read once (linear in what is read), and at most about `lines` x
    `max_line_bytes` bytes are read: an island that prints gigabytes without a newline
    costs its supervisor no more than one page of lines. A line longer than
    `max_line_bytes` keeps its end, cut at the front and marked with CUT.
    """
    if lines <= 0:
        return []
    budget = lines * (max_line_bytes + 1) + 1
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = pos = f.tell()
            blocks: list[bytes] = []
            newlines = 0
            while pos > 0 and newlines <= lines and end - pos < budget:
                step = min(block, pos, budget - (end - pos))
                pos -= step
                f.seek(pos)
                blocks.append(f.read(step))
                newlines += blocks[-1].count(b"\n")
    except FileNotFoundError:
        return []
    found = b"".join(reversed(blocks)).splitlines()[-lines:]
    return [(CUT + line[-max_line_bytes:].decode("utf-8", errors="ignore")
             if len(line) > max_line_bytes else line.decode("utf-8", errors="replace"))
            for line in found]
