"""The machine's processes as /proc shows them, for the benchmarks that watch a
whole system (bench/efficiency.py, the soak's checks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def processes() -> Iterator[tuple[int, list[str], str]]:
    """(pid, the fields of /proc/PID/stat after the command's name, command line) of
    every process; one that ends while it is read is left out."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except (OSError, IndexError):
            continue
        yield int(entry.name), fields, cmdline
