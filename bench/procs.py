"""The machine's processes as psutil reads them, for the benchmarks that watch a
whole system (bench/efficiency.py, the soak's checks)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

import psutil

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Proc(NamedTuple):
    """One process: its parent and process group, whether it still runs (a zombie or a
    dead one does not), the CPU it used (user and system, in clock ticks) and its
    command line."""
    pid: int
    ppid: int
    pgid: int
    running: bool
    cpu_ticks: int
    cmdline: str


def processes() -> Iterator[Proc]:
    """Every process; one that ends while it is read is left out."""
    for process in psutil.process_iter(["ppid", "status", "cpu_times", "cmdline"]):
        info = process.info
        try:
            pgid = os.getpgid(process.pid)
        except ProcessLookupError:
            continue
        if info["ppid"] is None or info["status"] is None:
            continue
        times = info["cpu_times"]
        ticks = round((times.user + times.system) * CLK_TCK) if times is not None else 0
        yield Proc(process.pid, info["ppid"], pgid,
                   info["status"] not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD), ticks,
                   " ".join(info["cmdline"] or ()))
