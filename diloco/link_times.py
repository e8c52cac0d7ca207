"""t_sync of the grace window from what the islands' links really did.

The configured estimate (diloco/wan.py `transfer_time` at the config's bandwidth and
latency, both ways) is what a link should take; with `emulation.link` none a real
network does the work, and it may be slower or faster. Each island's heartbeat counts
its sends and pulls and their link seconds, cumulative per epoch: between two of its
heartbeats, the seconds over the count are the time of one message in that
direction. t_sync is then the median island's recent send plus its recent pull (each
the median over islands of an island's median over its last WINDOW figures), and the
configured round trip until both directions are measured. A lost island's figures
are dropped: the links of the living size the window.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

# The figures per island and direction the median is over: recent, and robust to one
# message that waited behind another.
WINDOW = 8
MEASURED, CONFIGURED = "measured", "configured"


@dataclass(frozen=True)
class LinkCounts:
    """An island's link counts from one heartbeat: messages and their link seconds,
    cumulative in its `epoch`."""

    epoch: int
    sends: int
    send_s: float
    pulls: int
    pull_s: float


class SyncTime(NamedTuple):
    """t_sync and what sized it: `measured` (the islands' links) or `configured`."""

    seconds: float
    source: str


def per_message_s(count_before: int, seconds_before: float, count: int,
                  seconds: float) -> float | None:
    """Seconds per message between two cumulative readings; None when no message came
    between them or the counts went back (a new epoch starts from 0)."""
    if count <= count_before or seconds < seconds_before:
        return None
    return (seconds - seconds_before) / (count - count_before)


def sync_time(sends: list[list[float]], pulls: list[list[float]],
              configured_s: float) -> SyncTime:
    """t_sync from each island's recent per-message send and pull seconds (one list per
    island, empty where none measured): the median over islands of each island's
    median, send plus pull; `configured_s` while either direction has no figure."""
    send = [statistics.median(s) for s in sends if s]
    pull = [statistics.median(s) for s in pulls if s]
    if not send or not pull:
        return SyncTime(configured_s, CONFIGURED)
    return SyncTime(statistics.median(send) + statistics.median(pull), MEASURED)


class LinkTimes:
    """The islands' recent per-message link seconds, from their successive heartbeats'
    counts (`observe`), and the t_sync they give (`sync_time`)."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self.last: dict[str, LinkCounts] = {}
        self.sends: dict[str, deque[float]] = {}
        self.pulls: dict[str, deque[float]] = {}

    def observe(self, island: str, counts: LinkCounts) -> None:
        """Take an island's counts; a figure per direction whose count grew since its
        last counts of the same epoch."""
        before = self.last.get(island)
        self.last[island] = counts
        if before is None or before.epoch != counts.epoch:
            return
        for figures, pair in ((self.sends, (before.sends, before.send_s, counts.sends,
                                            counts.send_s)),
                              (self.pulls, (before.pulls, before.pull_s, counts.pulls,
                                            counts.pull_s))):
            seconds = per_message_s(*pair)
            if seconds is not None:
                figures.setdefault(island, deque(maxlen=self.window)).append(seconds)

    def forget(self, island: str) -> None:
        """Drop a lost island's figures: t_sync is what the links of the living do, and
        the island measures its link afresh when it is back."""
        self.last.pop(island, None)
        self.sends.pop(island, None)
        self.pulls.pop(island, None)

    def sync_time(self, configured_s: float) -> SyncTime:
        """t_sync from the figures taken (`diloco.link_times.sync_time`)."""
        return sync_time([list(s) for s in self.sends.values()],
                         [list(s) for s in self.pulls.values()], configured_s)
