"""The figures of a run that has completed, kept in its last status snapshot.

When the budget is spent (or a user's stop is done) syncd ends the run's accounting
and adds an "outcome" to the final snapshot: goodput, the island-seconds lost by
cause, the longest stall, start-up, uptime and its theta, the merge marks per
fragment (seconds since the start; uptime for any theta follows from them with
diloco.uptime.uptime_from_marks), each island's fault-free step time, tokens
merged and the final eval loss. The benchmarks read it; the
control room can show it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from syncd.status import theta

if TYPE_CHECKING:
    from diloco.accounting import RunAccounting
    from syncd.spec import RunSpec


def finish(accounting: RunAccounting, spec: RunSpec, now: float, *, tokens_merged: int,
           eval_loss: float | None, versions: list[int], theta_s: float | None = None
           ) -> dict[str, Any]:
    """End the run's accounting at `now` and return its outcome; uptime's theta is
    `theta_s` (the final status's), or from the step times alone without it."""
    if accounting.clock.end is None:
        accounting.clock.finish(now)
    snap = accounting.snapshot(now, theta(accounting, spec) if theta_s is None else theta_s)
    return {
        "start": accounting.clock.start, "end": accounting.clock.end, "wall_s": snap["wall_s"],
        "goodput": snap["goodput"], "useful_s": snap["useful_s"],
        "allocated_s": snap["allocated_s"], "lost_s": snap["lost_s"],
        "unattributed_s": snap["unattributed_s"], "max_stall_s": snap["max_stall_s"],
        "median_merge_gap_s": snap["median_merge_gap_s"], "merges": snap["merges"],
        "merge_marks": [round(m, 3) for m in accounting.merge_marks()],
        "fragment_marks": [[round(m, 3) for m in marks] for marks in accounting.fragment_marks()],
        "startup_s": snap["startup_s"], "uptime": snap["uptime"], "theta_s": snap["theta_s"],
        "step_time_s": {name: accounting.step_time(name) for name in accounting.islands},
        "islands": snap["islands"], "tokens_merged": tokens_merged,
        "eval_loss": eval_loss, "versions": versions,
    }
