"""Staleness: how old the updates a run merges are, island by island.

An update's **age** at a merge is the number of global versions of its fragment
published between its anchor (the version it was computed against, its base
version) and the merge it entered: the merge that makes version v + 1 from v takes
an update based on b at age v - b. An island that waits for each merge (mode sync,
or K = M with its update in every round) sends at age 0, or 1 when a round merged
while its update was on the way; an island that falls behind reads its lag.

`Staleness` keeps each island's recent ages (a bounded window) and says them as
p50, p95 and max; pure, no clock: syncd, the in-process cluster and the benchmarks
feed it the ages of each merge (diloco.synchronizer.MergeResult.ages).
"""

from __future__ import annotations

import math
from collections import deque

WINDOW = 256  # ages kept per island


def age_gate(age: int, max_staleness: int, weighting: str) -> float:
    """How much of an update of this age a merge takes (sync.staleness_weighting):
    cosine, (1 + cos(pi x age / (max_staleness + 1))) / 2, 1 at age 0 and falling to
    near 0 at the oldest age kept; none, 1 at every age."""
    if weighting == "none":
        return 1.0
    if weighting != "cosine":
        raise ValueError(f"staleness weighting must be none or cosine, got {weighting!r}")
    return 0.5 * (1.0 + math.cos(math.pi * max(age, 0) / (max_staleness + 1)))


def percentile(values: list[int], q: float) -> float:
    """The q-quantile (0..1) of values by linear interpolation; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def summary(ages: list[int]) -> dict[str, float]:
    """p50, p95, max and the count of some ages."""
    return {"p50": round(percentile(ages, 0.5), 2), "p95": round(percentile(ages, 0.95), 2),
            "max": max(ages, default=0), "count": len(ages)}


class Staleness:
    """The ages of the updates merged, per island, the last WINDOW of each."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self.ages: dict[str, deque[int]] = {}
        self.last: dict[str, int] = {}

    def merged(self, ages: dict[str, int]) -> None:
        """One merge's ages, island -> age."""
        for island, age in ages.items():
            self.ages.setdefault(island, deque(maxlen=self.window)).append(age)
            self.last[island] = age

    def island(self, name: str) -> dict[str, float]:
        """One island's last age and its p50, p95 and max over the window."""
        return {"last": self.last.get(name, 0), **summary(list(self.ages.get(name, ())))}

    def run(self) -> dict[str, float]:
        """Every island's ages together."""
        return summary([a for ages in self.ages.values() for a in ages])
