"""The figures of a run that has completed, kept in its last status snapshot.

When the budget is spent syncd ends the run's accounting and adds an "outcome"
to the final snapshot: goodput, the island-seconds lost by cause, the longest
stall, start-up, uptime and its theta, the merge marks per fragment (seconds since
the start; uptime for any theta follows from them with
diloco.accounting.uptime_from_marks), each island's fault-free step time, tokens
merged and the final eval loss. The benchmarks read it; the
control room can show it.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from syncd import recovery
from syncd.status import run_status, theta

if TYPE_CHECKING:
    from syncd.service import RunSync

log = logging.getLogger("archipelago.syncd")


def finish(run: RunSync, now: float) -> dict[str, Any]:
    """End the run's accounting at `now` and return its outcome."""
    acct = run.accounting
    if acct.end is None:
        acct.finish(now)
    snap = acct.snapshot(now, theta(run))
    return {
        "start": acct.start, "end": acct.end, "wall_s": snap["wall_s"],
        "goodput": snap["goodput"], "useful_s": snap["useful_s"],
        "allocated_s": snap["allocated_s"], "lost_s": snap["lost_s"],
        "unattributed_s": snap["unattributed_s"], "max_stall_s": snap["max_stall_s"],
        "median_merge_gap_s": snap["median_merge_gap_s"], "merges": snap["merges"],
        "merge_marks": [round(m, 3) for m in acct.merge_marks()],
        "fragment_marks": [[round(m, 3) for m in marks] for marks in acct.fragment_marks()],
        "startup_s": snap["startup_s"], "uptime": snap["uptime"], "theta_s": snap["theta_s"],
        "step_time_s": {name: acct.step_time(name) for name in acct.islands},
        "islands": snap["islands"], "tokens_merged": run.tokens_merged(),
        "eval_loss": run.eval_loss, "versions": list(run.sync.versions),
    }


def complete(run: RunSync) -> None:
    """The budget is spent: the run ends as completed (or as stopped, if a user's stop
    was under way)."""
    end(run, "stopped" if run.stop_seen is not None else "completed")
    log.info("run %s completed: %d tokens merged, eval loss %.4f", run.store.run_id,
             run.tokens_merged(), run.eval_loss)


def stop(run: RunSync, now: float) -> None:
    """A user's stop, once the islands sent what they had and exited (or the wait ran
    out): merge every open round as it is, whatever the quorum, and end the run as
    stopped, its final checkpoint kept."""
    for p in range(len(run.fragments)):
        if run.sync.rounds[p]:
            run.merge_round(p, now, "stop")
    end(run, "stopped")
    log.info("run %s stopped: %d tokens merged, eval loss %.4f", run.store.run_id,
             run.tokens_merged(), run.eval_loss)


def end(run: RunSync, state: str) -> None:
    """Mark the run done, evaluate the global model, keep the final snapshot with its
    outcome, write the final checkpoint (a checkpoint event), record the run's tokens
    and the islands as stopped, move the run to `state` (completed or stopped) and free
    the run's Redis keys but that snapshot and the logs. No merge follows."""
    run.completed = True
    run.store.mark_done()
    run.eval_loss, run.eval_tokens = run.evaluate(), run.tokens_merged()
    now = run.clock()
    status = run_status(run, now, run.live, run.last_status)
    status["outcome"] = finish(run, now)
    run.store.put_status(status)
    run.record_progress(status)
    run.next_status = math.inf  # the final snapshot, with the outcome, stays
    recovery.save_checkpoint(run)
    for island in run.config.islands:
        run.recorder.island(island.name, state="stopped")
    run.recorder.flush()
    run.recorder.end(state)
    run.store.release()  # its last status (with the outcome) and the logs stay
