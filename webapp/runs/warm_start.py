"""A start waits for warm standbys: each region's pool fills before the run's islands
are dispatched, for a bounded time (ISLAND_POOL_FILL_WAIT_S).

The pool managers size their pools by the active runs (trainer.pool.wanted_size), so
a run that has just published its spec makes its regions' pools grow; the start waits
until each region with a pool has a standby ready for each of its islands of one
process, or the time is up. Islands without one start cold, which an event says.
Regions with no pool manager announced are not waited for (their islands start cold,
as always).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from syncd.pool_store import PoolStore

POLL_S = 0.25


def standbys_wanted(config: dict[str, Any], names: Iterable[str]) -> Counter[str]:
    """Per region, the islands among `names` that a standby can take (one process)."""
    islands = {i["name"]: i for i in config.get("islands", [])}
    return Counter(islands[n]["region"] for n in names
                   if n in islands and islands[n].get("processes", 1) == 1)


def wait_for_standbys(pools: PoolStore, wanted: Counter[str], wait_s: float, *,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep
                      ) -> dict[str, dict[str, int]]:
    """Wait up to `wait_s` for every region of `wanted` that has a pool to announce as
    many standbys ready as it wants; the regions still short then, each with
    {"ready", "wanted"} ({} when every pool filled in time)."""
    pooled = {region: n for region, n in wanted.items() if pools.hosts(region)}
    deadline = clock() + wait_s
    while True:
        short = {region: {"ready": ready, "wanted": n} for region, n in pooled.items()
                 if (ready := pools.ready(region)) < n}
        if not short or clock() >= deadline:
            return short
        sleep(POLL_S)


def cold_start_message(short: dict[str, dict[str, int]], wait_s: float) -> str:
    """What an event says of the islands that start cold: per region, what was ready."""
    parts = [f"{region} had {s['ready']} of {s['wanted']} standbys ready"
             for region, s in sorted(short.items())]
    cold = sum(s["wanted"] - s["ready"] for s in short.values())
    return (f"{cold} island{'s' if cold != 1 else ''} start{'s' if cold == 1 else ''} cold: "
            f"after {wait_s:g} s {', '.join(parts)}")
