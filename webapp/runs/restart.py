"""After the whole system restarted (`python -m webapp.start`, or an upgrade:
docs/OPERATIONS.md, "Upgrading"): every running or paused run goes on, and its
timeline says what the restart cost it; a start that was under way goes on."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from webapp.runs.dispatch import put_spec, start_next_epoch
from webapp.runs.models import Event, Run
from webapp.runs.starting import finish_start_later
from webapp.runs.stores import run_store

if TYPE_CHECKING:
    from syncd.store import RunStore


def resume_after_restart() -> list[Run]:
    """After the whole system restarted: run every island of every running or paused run again.

    Each island starts its next epoch (so nothing left over from before the
    restart merges) and goes on from its data cursor; a paused run stays paused.
    The interval the run lost is an "alert" event on its timeline (lost_interval).
    A queued run's start is queued again on the control worker, each island at its
    next epoch (its task may have died with its worker, or may still come: an island
    it starts is then of an older epoch). Returns the runs it resumed.
    """
    for queued in Run.objects.filter(state=Run.State.QUEUED).order_by("id"):
        finish_start_later(queued, None, again=True)
    runs = list(Run.objects.running_or_paused().order_by("id"))
    for run in runs:
        store = run_store(run)
        Event.objects.create(run=run, kind=Event.Kind.ALERT,
                             detail=lost_interval(store, time.time()))
        put_spec(run, store)
        for island in run.current_islands():
            start_next_epoch(run, island, store)
    return runs


def lost_interval(store: RunStore, now: float) -> dict[str, Any]:
    """What a restart of the whole system cost a run, as an event's detail.

    The system went down at the last sign of life the run left in Redis (its
    islands' heartbeats, syncd's status snapshot), which the project's Redis keeps
    across a crash in its append-only file; it is back at `now`.
    """
    marks = [b.time for b in store.signals.heartbeats().values()]
    status = store.status() or {}
    if isinstance(status.get("time"), int | float):
        marks.append(float(status["time"]))
    if not marks:
        return {"message": "the system restarted; the run's islands start again",
                "lost_interval": None}
    down_from = min(max(marks), now)
    down_s = round(now - down_from, 1)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(down_from))
    return {"message": f"the system was down for {down_s:g} s from {stamp}; the run's "
                       "islands start again",
            "lost_interval": {"from": down_from, "until": now, "seconds": down_s}}
