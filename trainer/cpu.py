"""An island process's share of its host's CPU, sent in its heartbeat.

The process reads its own CPU time (utime + stime, with psutil) and divides
what it used over a window of wall time by the wall time and the host's cores: 1.0
is every core of the host; an island of one thread that has a core to itself shows
1 / C. One that shows much less than its threads / C is starved: the host has more
work than cores (docs/OPERATIONS.md, "How many islands a host serves").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

# CPU shares are over at least this much wall time: /proc's clock ticks are 10 ms.
WINDOW_S = 2.0


def process_cpu_s() -> float:
    """This process's CPU seconds so far, user and system (utime + stime)."""
    times = psutil.Process().cpu_times()
    return times.user + times.system


class CpuMeter:
    """A process's share of its host's CPU over the last window of wall time.

    Args:
        cores: the host's cores; default os.cpu_count().
        window_s: the least wall time a share is measured over.
        clock: wall seconds (monotonic).
        cpu: the process's CPU seconds so far.
    """

    def __init__(self, cores: int | None = None, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic,
                 cpu: Callable[[], float] = process_cpu_s):
        self.cores = cores or os.cpu_count() or 1
        self.window_s = window_s
        self.clock = clock
        self.cpu = cpu
        self.mark: tuple[float, float] | None = None  # (wall, CPU seconds)
        self.last: float | None = None

    def share(self) -> float | None:
        """The share (0 to 1) of the host's CPU the process used over its last full
        window; None before one has passed."""
        now, used = self.clock(), self.cpu()
        if self.mark is None:
            self.mark = (now, used)
        elif now - self.mark[0] >= self.window_s:
            self.last = round((used - self.mark[1]) / (now - self.mark[0]) / self.cores, 4)
            self.mark = (now, used)
        return self.last


_THIS_PROCESS = CpuMeter()


def cpu_share() -> float | None:
    """This process's share of its host's CPU over the last window (CpuMeter.share)."""
    return _THIS_PROCESS.share()
