"""When a fragment merges: minimum quorum, then an adaptive grace window.

Decoupled DiLoCo (arXiv 2604.21428) never waits for every island. A fragment's
round merges once K updates are in (the minimum quorum), but not at once: a
grace window stays open while waiting costs the senders nothing, so that a
late island still joins. The first sender trains `overlap_steps` (tau) more
inner steps before it needs the merged fragment; what is left of that time
after reaching quorum and syncing is free:

    grace = gamma * (tau * t_step - t_quorum - t_sync), clamped at 0

Everything here is a pure function of the arrivals, a clock value and recent
statistics. Nothing sleeps or reads the time; syncd and the
simulators pass `now` in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arrival:
    """One island's update for a fragment, as the policy sees it."""

    island: str
    time: float
    base_version: int


@dataclass(frozen=True)
class RoundStats:
    """Recent timings that size the grace window, all in seconds.

    step_time_s: a typical island's inner step (the median over alive islands).
    sync_time_s: from a merge decision to the islands holding the new fragment.
    island_step_s: each island's own inner step, where known (when each is expected
        next: sync.merge_each_period).
    """

    step_time_s: float
    sync_time_s: float
    island_step_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    merge: bool
    reason: str
    deadline: float | None = None  # when to decide again, if waiting on the clock
    grace_s: float = 0.0


def grace_window(gamma: float, overlap_steps: int, step_time_s: float,
                 time_to_quorum_s: float, sync_time_s: float) -> float:
    """The paper's grace rule: gamma * (tau * t_step - t_quorum - t_sync), at least 0.

    Args:
        gamma: scales the window; 0 merges at quorum, math.inf waits for everyone.
        overlap_steps: tau, the inner steps a sender trains before it needs the merge.
        step_time_s: a typical inner step.
        time_to_quorum_s: from the round's first arrival to its K-th.
        sync_time_s: from a merge decision to the islands holding the result.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be at least 0, got {gamma}")
    if gamma == math.inf:
        return math.inf
    return max(0.0, gamma * (overlap_steps * step_time_s - time_to_quorum_s - sync_time_s))


def decide(arrivals: list[Arrival], now: float, *, min_quorum: int, alive_islands: int,
           gamma: float, overlap_steps: int, stats: RoundStats,
           period_ends: float | None = None) -> Decision:
    """Whether one fragment's round should merge now.

    Args:
        arrivals: the updates in the round, one per island, not yet merged.
        now: the current time on the caller's clock.
        min_quorum: K, updates needed before a merge.
        alive_islands: islands currently alive; once all of them are in, waiting
            longer cannot bring anyone else.
        gamma, overlap_steps: as in `grace_window`.
        stats: recent step and sync times.
        period_ends: until when the round waits for the islands expected within the
            fragment's synchronization period (Synchronizer.period_ends): with it, a
            round that reached its quorum merges then, with what arrived by then (the
            paper's rule, sync.merge_each_period), not before, unless every alive
            island is in.
    """
    if min_quorum < 1:
        raise ValueError(f"min_quorum must be at least 1, got {min_quorum}")
    n = len(arrivals)
    if n < min_quorum:
        missing = min_quorum - n
        return Decision(False, f"waiting for {missing} more island{'s' * (missing > 1)}"
                               f" ({n}/{min_quorum})")
    if n >= alive_islands:
        return Decision(True, f"all {alive_islands} alive islands arrived")
    times = sorted(a.time for a in arrivals)
    quorum_at = times[min_quorum - 1]
    grace = grace_window(gamma, overlap_steps, stats.step_time_s, quorum_at - times[0],
                         stats.sync_time_s)
    deadline = quorum_at + grace
    if period_ends is not None and period_ends > deadline:
        deadline, grace = period_ends, period_ends - quorum_at
    if now >= deadline:
        return Decision(True, f"quorum of {min_quorum} reached and the grace window closed",
                        grace_s=grace)
    return Decision(False, f"quorum reached; grace {deadline - now:.1f} s left",
                    deadline=deadline, grace_s=grace)


def is_stale(base_version: int, newest_version: int, max_staleness: int) -> bool:
    """An update based on a version older than newest - max_staleness is dropped."""
    return base_version < newest_version - max_staleness
