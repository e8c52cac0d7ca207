"""syncd's tick as a merge feels it (PassTimes), which the run status shows."""

from __future__ import annotations

import math
import statistics
from collections import deque

TICK_WINDOW_S = 30  # seconds of passes whose typical longest is syncd's tick


class PassTimes:
    """syncd's tick as a merge feels it: the time from the start of one pass over the
    run to the next, which a merge that comes due meanwhile waits for.

    `tick_s` is the median, over the last `window_s` seconds, of each second's longest
    pass: the status, flush and evaluation work that recurs every second or so counts,
    a one-off hang (one second's) does not, and stays down time.
    """

    def __init__(self, window_s: int = TICK_WINDOW_S):
        self.last: float | None = None
        self.second: int | None = None
        self.longest = 0.0  # the current second's
        self.maxima: deque[float] = deque(maxlen=window_s)  # the seconds before it

    def mark(self, now: float) -> None:
        """A pass starts at `now`."""
        if self.last is not None:
            second = math.floor(now)
            if second != self.second:
                if self.second is not None:
                    self.maxima.append(self.longest)
                self.second, self.longest = second, 0.0
            self.longest = max(self.longest, now - self.last)
        self.last = now

    @property
    def tick_s(self) -> float:
        if self.second is None:
            return 0.0
        return statistics.median([*self.maxima, self.longest])
