"""The figures of a run that has completed, kept in its last status snapshot.

When the budget is spent syncd ends the run's accounting and adds an "outcome"
to the final snapshot: goodput, the island-seconds lost by cause, the longest
stall, the merge marks (seconds since the start; uptime for any theta follows
from them with syncd.accounting.uptime_from_marks), each island's fault-free
step time, tokens merged and the final eval loss. The benchmarks read it; the
control room can show it.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from syncd import recovery
from syncd.status import run_status

if TYPE_CHECKING:
    from syncd.service import RunSync

log = logging.getLogger("archipelago.syncd")


def finish(run: RunSync, now: float) -> dict[str, Any]:
    """End the run's accounting at `now` and return its outcome."""
    acct = run.accounting
    if acct.end is None:
        acct.finish(now)
    snap = acct.snapshot(now)
    return {
        "start": acct.start, "end": acct.end, "wall_s": snap["wall_s"],
        "goodput": snap["goodput"], "useful_s": snap["useful_s"],
        "allocated_s": snap["allocated_s"], "lost_s": snap["lost_s"],
        "unattributed_s": snap["unattributed_s"], "max_stall_s": snap["max_stall_s"],
        "median_merge_gap_s": snap["median_merge_gap_s"], "merges": snap["merges"],
        "merge_marks": [round(m, 3) for m in acct.merge_marks()],
        "step_time_s": {name: acct.step_time(name) for name in acct.islands},
        "islands": snap["islands"], "tokens_merged": run.tokens_merged(),
        "eval_loss": run.eval_loss, "versions": list(run.sync.versions),
    }


def complete(run: RunSync) -> None:
    """The budget is spent: mark the run done, evaluate the global model, keep the
    final snapshot with its outcome, checkpoint, record the tokens and free the run's
    Redis keys but that snapshot. No merge follows."""
    run.completed = True
    run.store.mark_done()
    run.eval_loss = run.evaluate()
    now = run.clock()
    status = run_status(run, now, run.live, run.last_status)
    status["outcome"] = finish(run, now)
    run.store.put_status(status)
    run.next_status = math.inf  # the final snapshot, with the outcome, stays
    recovery.save_checkpoint(run)
    tokens = run.tokens_merged()
    run.recorder.run_tokens(tokens)
    run.recorder.flush()
    run.recorder.complete()
    run.store.release()  # its last status (with the outcome) and the logs stay
    log.info("run %s completed: %d tokens merged, eval loss %.4f", run.store.run_id,
             tokens, run.eval_loss)
