"""Faults on purpose: kill an island or a region, straggle, partition, degrade,
corrupt, kill syncd; and the alert when an island crashes on its own.

Each is carried out where it must be: a kill by the island's supervisor on its
own host (a command in Redis), the other island faults by the island process
itself (a key it reads), a kill of syncd by syncd. Every one is an event that
says who asked.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from django.conf import settings

from webapp.runs.models import Event, Island, Run
from webapp.runs.services import (
    RUNNING_OR_PAUSED,
    get_island,
    live_islands,
    record_event,
    require_state,
)
from webapp.runs.stores import run_store

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

FAULT_KINDS = ("straggle", "partition", "degrade", "corrupt")
# What a fault does (trainer/runner.py acts it out), what its factor means there, and
# the factor it takes when none is given.
FAULT_FACTORS = {
    "straggle": ("each inner step takes factor times as long", 4.0),
    "partition": ("the link is down, heartbeats too; the factor is not used", 1.0),
    "degrade": ("the link's bandwidth is divided by factor", 10.0),
    "corrupt": ("the next update carries NaN; the factor is not used", 1.0),
}
MAX_FAULT_SECONDS = 24 * 3600


def kill_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> Island:
    """Kill an island's process with SIGKILL, mid-step, on its own host."""
    require_state(run, RUNNING_OR_PAUSED, "kill an island")
    island = get_island(run, island)
    run_store(run).send_command(island.name, "kill", epoch=island.epoch)
    record_event(run, island, Event.Kind.FAULT, by, fault="kill", epoch=island.epoch)
    return island


def kill_region(run: Run, region: str, by: AbstractBaseUser | None) -> list[Island]:
    """A region outage: every island of the run in that region is killed, and their
    supervisors hold the deaths back (a region that has gone dark tells no one):
    syncd finds out by the heartbeat timeout, as it would of a real one."""
    require_state(run, RUNNING_OR_PAUSED, "kill a region")
    islands = [island for island in live_islands(run) if island.region == region]
    if not islands:
        regions = sorted({island.region for island in live_islands(run)})
        raise ValueError(f"run {run.name!r} has no island in region {region!r} "
                         f"(its regions: {', '.join(regions)})")
    store = run_store(run)
    for island in islands:
        store.send_command(island.name, "kill", epoch=island.epoch, report=False)
        record_event(run, island, Event.Kind.FAULT, by, fault="kill", region=region,
               epoch=island.epoch)
    return islands


def inject_fault(run: Run, island: Island | str, kind: str, seconds: float,
                 factor: float | None = None, by: AbstractBaseUser | None = None) -> Island:
    """Break an island for `seconds`: the island process reads the fault and acts it out.

    Args:
        kind: straggle, partition, degrade or corrupt (FAULT_FACTORS says what each does
            with its factor).
        seconds: how long the fault lasts, more than 0 and at most a day.
        factor: see FAULT_FACTORS; None takes its default there.

    Raises:
        ValueError: for an unknown kind, a bad duration or factor, an island the run
            does not have, or a run that is not running.
    """
    if kind not in FAULT_KINDS:
        raise ValueError(f"fault kind must be one of {', '.join(FAULT_KINDS)}, got {kind!r} "
                         "(kill_island and kill_region kill processes)")
    if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
            or not math.isfinite(seconds) or not 0 < seconds <= MAX_FAULT_SECONDS):
        raise ValueError(f"seconds must be more than 0 and at most {MAX_FAULT_SECONDS}, "
                         f"got {seconds!r}")
    factor = _fault_factor(kind, factor)
    require_state(run, (Run.State.RUNNING,), "inject a fault")
    island = get_island(run, island)
    until = time.time() + seconds
    run_store(run).set_fault(island.name, kind, until, factor, seconds)
    record_event(run, island, Event.Kind.FAULT, by, fault=kind, seconds=seconds, factor=factor,
           until=until, epoch=island.epoch)
    return island


def _fault_factor(kind: str, factor: float | None) -> float:
    if factor is None:
        return FAULT_FACTORS[kind][1]
    if isinstance(factor, bool) or not isinstance(factor, int | float) \
            or not math.isfinite(factor):
        raise ValueError(f"factor must be a finite number, got {factor!r}")
    if kind in ("straggle", "degrade") and not 1 <= factor <= 1e6:
        raise ValueError(f"factor of {kind} must be between 1 and 1e6 "
                         f"({FAULT_FACTORS[kind][0]}), got {factor:g}")
    return float(factor)


def kill_syncd(by: AbstractBaseUser) -> None:
    """Kill syncd with SIGKILL, wherever it runs; its supervisor brings it back.

    Only admins may: every run stalls until syncd is back.

    Raises:
        PermissionError: when `by` is not a superuser.
    """
    if not getattr(by, "is_superuser", False):
        raise PermissionError("Only admins may kill syncd.")
    from syncd.connection import connect
    from syncd.control import kill_syncd as send_kill

    send_kill(connect(settings.REDIS_URL))
    for run in Run.objects.filter(state__in=RUNNING_OR_PAUSED):
        Event.objects.create(run=run, kind=Event.Kind.FAULT, actor=by,
                             detail={"fault": "kill_syncd"})
