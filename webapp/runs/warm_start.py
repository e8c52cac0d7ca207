"""A start waits for warm standbys: each region's pool fills before the run's islands
are dispatched, for a bounded time (ISLAND_POOL_FILL_WAIT_S).

The pool managers size their pools by the active runs (trainer.pool.wanted_size), so
a run that has just published its spec makes its regions' pools grow; the start waits
until each region with a pool has a standby ready for each of its islands of one
process and one more, for the first rejoin (a refill after the start runs at idle
priority and gets no CPU while the islands fill the cores), or the time is up.
Islands without one start cold, which an event says.
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


def standbys_wanted(config: dict[str, Any], names: Iterable[str], pool_size: int | None
                    ) -> dict[str, dict[str, int]]:
    """Per region, the islands among `names` a standby can take (one process) and the
    standbys its pool is to have before they start: one per island plus the one a
    first rejoin takes (`pool_size` None: the pools' default), at most `pool_size`."""
    configs = {i["name"]: i for i in config.get("islands", [])}
    islands = Counter(configs[n]["region"] for n in names
                      if n in configs and configs[n].get("processes", 1) == 1)
    return {region: {"islands": n, "wanted": n + 1 if pool_size is None
                     else min(n + 1, pool_size)} for region, n in islands.items()}


def wait_for_standbys(pools: PoolStore, wanted: dict[str, dict[str, int]], wait_s: float, *,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep
                      ) -> dict[str, dict[str, int]]:
    """Wait up to `wait_s` for every region of `wanted` that has a pool to announce as
    many standbys ready as it wants; the regions where islands then start cold, each
    with {"ready", "wanted", "islands"} ({} when none does)."""
    pooled = {region: w for region, w in wanted.items() if pools.hosts(region)}
    deadline = clock() + wait_s
    while True:
        ready = {region: pools.ready(region) for region in pooled}
        if all(ready[r] >= w["wanted"] for r, w in pooled.items()) or clock() >= deadline:
            return {region: {**w, "ready": ready[region]} for region, w in pooled.items()
                    if ready[region] < w["islands"]}
        sleep(POLL_S)


def cold_start_message(short: dict[str, dict[str, int]], wait_s: float) -> str:
    """What an event says of the islands that start cold: per region, what was ready."""
    parts = [f"{region} had {s['ready']} of {s['wanted']} standbys ready"
             for region, s in sorted(short.items())]
    cold = sum(s["islands"] - s["ready"] for s in short.values())
    return (f"{cold} island{'s' if cold != 1 else ''} start{'s' if cold == 1 else ''} cold: "
            f"after {wait_s:g} s {', '.join(parts)}")
