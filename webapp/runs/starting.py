"""A run's start, in two parts.

The first answers the request: the run is checked against the hosts' memory, becomes
`queued` and its processes are told what to run (its spec, its islands' Redis user,
epoch 1 of each island). The second may take up to ISLAND_POOL_FILL_WAIT_S: it waits
for its regions' pools to fill (webapp/runs/warm_start.py), starts each island
(webapp/runs/dispatch.py) and makes the run `running`. The API and the run page queue
it as a Celery task on the control queue and answer at once (202); the system's own
starts (the demo, benchmarks, tests) run both parts in turn. `Run.start_progress`
says where a start is: queued, filling_pools, starting_islands, started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery import shared_task
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from diloco.config_parse import ConfigError
from trainer.queues import CONTROL_QUEUE
from webapp.runs.dispatch import enqueue, put_island_user_of, put_spec, start_next_epoch
from webapp.runs.models import Event, Run
from webapp.runs.stores import pool_store, run_store
from webapp.runs.validation import admitted_configs, memory_misfits
from webapp.runs.warm_start import cold_start_message, standbys_wanted, wait_for_standbys

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

Progress = Run.StartProgress


def begin_start(run: Run, by: AbstractBaseUser | None) -> None:
    """The part of a start that answers at once: check the memory, make the run `queued`
    (progress queued), publish its spec, make its islands' Redis user and give every
    island epoch 1.

    Raises:
        ConfigError: when the run does not fit the memory the hosts declare beside the
            admitted runs (webapp.runs.validation.memory_misfits).
        WrongState: when the run is not a draft.
    """
    if run.state == Run.State.DRAFT and (
            misfits := memory_misfits(run.run_config(), admitted_configs(run))):
        raise ConfigError(misfits)
    run.transition(Run.State.QUEUED, by=by)
    _progress(run, Progress.QUEUED)
    try:
        store = run_store(run)
        put_spec(run, store)
        _, no_user = put_island_user_of(run)
        if no_user:
            Event.objects.create(run=run, kind=Event.Kind.ALERT, actor=by,
                                 detail={"message": no_user})
        islands = list(run.current_islands())
        with transaction.atomic():
            for island in islands:
                island.epoch = 1
                island.save(update_fields=["epoch"])
        for island in islands:
            store.set_epoch(island.name, island.epoch)
    except Exception as e:
        run.transition(Run.State.FAILED, by=by, reason=f"The run could not be started: {e}")
        raise


def finish_start(run: Run, by: AbstractBaseUser | None, *, again: bool = False) -> None:
    """The rest of a start: wait a bounded time for the regions' pools to fill (progress
    filling_pools; an event says which islands start cold), start every island
    (starting_islands) and make the run `running` (started). A run that is no longer
    queued (stopped meanwhile) is left as it is. A start tried `again` (after a restart
    of the system) or that an earlier try left among its islands starts each island's
    next epoch: should an earlier try still start some, their epoch is an older one,
    which neither a launcher nor syncd lets run."""
    run.refresh_from_db(fields=["state", "start_progress"])
    if run.state != Run.State.QUEUED:
        return
    again = again or run.start_progress == Progress.STARTING_ISLANDS
    try:
        store = run_store(run)
        islands = list(run.current_islands())
        _progress(run, Progress.FILLING_POOLS)
        wait_s = settings.ISLAND_POOL_FILL_WAIT_S
        short = wait_for_standbys(pool_store(), standbys_wanted(
            run.config, [island.name for island in islands], settings.ISLAND_POOL_SIZE),
            wait_s)
        run.refresh_from_db(fields=["state"])
        if run.state != Run.State.QUEUED:
            return  # stopped while the pools filled: no island starts
        _progress(run, Progress.STARTING_ISLANDS)
        for island in islands:
            if again:
                start_next_epoch(run, island, store)
            else:
                enqueue(run, island)
        if short:
            Event.objects.create(run=run, kind=Event.Kind.ALERT, actor=by, detail={
                "message": cold_start_message(short, wait_s), "cold_start": short})
    except Exception as e:
        run.transition(Run.State.FAILED, by=by, reason=f"The run could not be started: {e}")
        raise
    run.transition(Run.State.RUNNING, by=by)
    _progress(run, Progress.STARTED)


@shared_task(name="runs.finish_start")
def finish_start_task(run_id: int, by_id: int | None = None, again: bool = False) -> None:
    """finish_start on the control worker."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return  # deleted meanwhile
    by = get_user_model().objects.filter(pk=by_id).first() if by_id is not None else None
    finish_start(run, by, again=again)


def finish_start_later(run: Run, by: AbstractBaseUser | None, *, again: bool = False) -> None:
    """Queue the rest of the start on the control worker (`again`: finish_start's)."""
    finish_start_task.apply_async(args=[run.pk, by.pk if by is not None else None, again],
                                  queue=CONTROL_QUEUE)


def _progress(run: Run, progress: str) -> None:
    Run.objects.filter(pk=run.pk).update(start_progress=progress)
    run.start_progress = progress
