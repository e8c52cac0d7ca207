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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from django.conf import settings

from webapp.runs import roles
from webapp.runs.models import Event, Island, Run
from webapp.runs.stores import run_store

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

MAX_FAULT_SECONDS = 24 * 3600


@dataclass(frozen=True)
class FaultRule:
    """What one kind of fault hits, who may cause it, and what it takes.

    Attributes:
        hits: an island, a region (every island of the run there) or the system.
        action: what a user must be allowed to do (webapp.runs.roles.ACTIONS).
        duration: "none" (instant), "required", or "optional" (default_seconds when
            left out); a duration is more than 0 and at most MAX_FAULT_SECONDS.
        factor: what the factor means where trainer/runner.py acts the fault out, or
            None for a fault that takes none; default_factor when left out, and
            within factor_range unless that is None (any finite number).
    """

    hits: Literal["island", "region", "system"]
    action: str
    duration: Literal["none", "required", "optional"] = "none"
    default_seconds: float | None = None
    factor: str | None = None
    default_factor: float | None = None
    factor_range: tuple[float, float] | None = None

    def factor_fits(self, factor: float) -> bool:
        """Whether `factor` is within the kind's range; without one, any finite number is."""
        return self.factor_range is None or \
            self.factor_range[0] <= factor <= self.factor_range[1]

    def factor_range_text(self) -> str:
        """The range as messages say it: between 1 and 1e6 (not 1e+06)."""
        low, high = (f"{bound:g}".replace("e+0", "e").replace("e+", "e")
                     for bound in self.factor_range or ())
        return f"between {low} and {high}"


FAULTS: dict[str, FaultRule] = {
    "kill": FaultRule("island", "fault"),
    "straggle": FaultRule("island", "fault", "required",
                          factor="each inner step takes factor times as long",
                          default_factor=4.0, factor_range=(1, 1e6)),
    "partition": FaultRule("island", "fault", "required",
                           factor="the link is down, heartbeats too; the factor is not used",
                           default_factor=1.0),
    "degrade": FaultRule("island", "fault", "required",
                         factor="the link's bandwidth is divided by factor",
                         default_factor=10.0, factor_range=(1, 1e6)),
    # One-shot: the island poisons its next update (within default_seconds unless the
    # fault says otherwise) and clears the fault.
    "corrupt": FaultRule("island", "fault", "optional", default_seconds=300.0,
                         factor="the next update carries NaN; the factor is not used",
                         default_factor=1.0),
    "outage": FaultRule("region", "fault"),
    "kill_syncd": FaultRule("system", "admin"),
}
# The faults the island process acts out for a while (inject_fault); a kill is instant.
TIMED_FAULTS = tuple(kind for kind, rule in FAULTS.items()
                     if rule.hits == "island" and rule.duration != "none")


def kinds_hitting(hits: str) -> tuple[str, ...]:
    """The kinds of fault that hit an island, a region or the system."""
    return tuple(kind for kind, rule in FAULTS.items() if rule.hits == hits)


def action_for(hits: str) -> str:
    """What a user must be allowed to do to cause the faults that hit `hits`: one action
    per target, since the API checks it before it reads which kind a body asks for."""
    [action] = {rule.action for rule in FAULTS.values() if rule.hits == hits}
    return action


def kill_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> Island:
    """Kill an island's process with SIGKILL, mid-step, on its own host."""
    run.require_state(Run.RUNNING_OR_PAUSED, "kill an island")
    island = run.get_island(island)
    run_store(run).signals.send_command(island.name, "kill", epoch=island.epoch)
    island.record_event(Event.Kind.FAULT, by, fault="kill", epoch=island.epoch)
    return island


def kill_region(run: Run, region: str, by: AbstractBaseUser | None) -> list[Island]:
    """A region outage: every island of the run in that region is killed, and their
    supervisors hold the deaths back (a region that has gone dark tells no one):
    syncd finds out by the heartbeat timeout, as it would of a real one."""
    run.require_state(Run.RUNNING_OR_PAUSED, "kill a region")
    islands = [island for island in run.current_islands() if island.region == region]
    if not islands:
        regions = sorted({island.region for island in run.current_islands()})
        raise ValueError(f"run {run.name!r} has no island in region {region!r} "
                         f"(its regions: {', '.join(regions)})")
    store = run_store(run)
    for island in islands:
        store.signals.send_command(island.name, "kill", epoch=island.epoch, report=False)
        island.record_event(Event.Kind.FAULT, by, fault="kill", region=region,
                            epoch=island.epoch)
    return islands


def inject_fault(run: Run, island: Island | str, kind: str, seconds: float,
                 factor: float | None = None, by: AbstractBaseUser | None = None) -> Island:
    """Break an island for `seconds`: the island process reads the fault and acts it out.

    Args:
        kind: straggle, partition, degrade or corrupt (TIMED_FAULTS; FAULTS says what
            each does with its factor).
        seconds: how long the fault lasts, more than 0 and at most a day.
        factor: see FAULTS; None takes the kind's default_factor.

    Raises:
        ValueError: for an unknown kind, a bad duration or factor, or an island the run
            does not have.
        WrongState: for a run that is not running.
    """
    if kind not in TIMED_FAULTS:
        raise ValueError(f"fault kind must be one of {', '.join(TIMED_FAULTS)}, got {kind!r} "
                         "(kill_island and kill_region kill processes)")
    if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
            or not math.isfinite(seconds) or not 0 < seconds <= MAX_FAULT_SECONDS):
        raise ValueError(f"seconds must be more than 0 and at most {MAX_FAULT_SECONDS}, "
                         f"got {seconds!r}")
    factor = _fault_factor(kind, factor)
    run.require_state((Run.State.RUNNING,), "inject a fault")
    island = run.get_island(island)
    until = time.time() + seconds
    run_store(run).signals.set_fault(island.name, kind, until, factor, seconds)
    island.record_event(Event.Kind.FAULT, by, fault=kind, seconds=seconds, factor=factor,
                        until=until, epoch=island.epoch)
    return island


def _fault_factor(kind: str, factor: float | None) -> float:
    rule = FAULTS[kind]
    if factor is None:
        return rule.default_factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) \
            or not math.isfinite(factor):
        raise ValueError(f"factor must be a finite number, got {factor!r}")
    if not rule.factor_fits(factor):
        raise ValueError(f"factor of {kind} must be {rule.factor_range_text()} "
                         f"({rule.factor}), got {factor:g}")
    return float(factor)


def kill_syncd(by: AbstractBaseUser) -> None:
    """Kill syncd with SIGKILL, wherever it runs; its supervisor brings it back.

    Only admins may: every run stalls until syncd is back.

    Raises:
        PermissionError: when `by` is not an admin (roles: an active superuser).
    """
    if not roles.can(by, FAULTS["kill_syncd"].action):
        raise PermissionError("Only admins may kill syncd.")
    from syncd.connection import connect
    from syncd.control import kill_syncd as send_kill

    send_kill(connect(settings.REDIS_URL))
    for run in Run.objects.running_or_paused():
        Event.objects.create(run=run, kind=Event.Kind.FAULT, actor=by,
                             detail={"fault": "kill_syncd"})
