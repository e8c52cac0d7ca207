"""What the UI and the API do to runs; both call these functions and nothing else."""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

from trainer.config import MODES, ConfigError, RunConfig, parse_config
from trainer.queues import region_queue
from trainer.supervisor import island_log_path, tail_lines
from trainer.tasks import run_island
from webapp.runs.models import RUN_NAME_MAX_LENGTH, Event, Island, Run
from webapp.runs.stores import run_store

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
    from django.db.models import QuerySet

    from syncd.store import RunStore


def default_config() -> dict[str, Any]:
    """The default run config, with its islands moved to a region this deployment has."""
    config = RunConfig().to_dict()
    for island in config["islands"]:
        if island["region"] not in settings.REGIONS:
            island["region"] = settings.REGIONS[0]
    return config


def create_run(*, name: Any, mode: Any, config: Any, user: AbstractBaseUser | None) -> Run:
    """Validate a new run and save it as a draft with one island row per configured island.

    Args:
        name: the run's name, 1 to 100 characters.
        mode: one of trainer.config.MODES.
        config: the run config as decoded JSON; missing fields take their defaults.
        user: who creates it, or None.

    Raises:
        ConfigError: with every problem found, keyed "name", "mode" or by the config's
            dotted path ("sync.min_quorum").
    """
    errors: dict[str, list[str]] = {}
    if isinstance(name, str):
        name = name.strip()
    if not isinstance(name, str) or not name:
        errors["name"] = ["This field is required."]
    elif len(name) > RUN_NAME_MAX_LENGTH:
        errors["name"] = [f"Must be at most {RUN_NAME_MAX_LENGTH} characters, got {len(name)}."]
    if mode not in MODES:
        errors["mode"] = [f"Must be one of {', '.join(MODES)}, got {mode!r}."]
    try:
        run_config = parse_config(config, settings.REGIONS)
    except ConfigError as e:
        for path, messages in e.errors.items():
            # An unknown top-level config key "name" or "mode" must not read as a
            # problem with the run's own name or mode.
            key = f"config.{path}" if path in ("name", "mode") else path
            errors.setdefault(key, []).extend(messages)
    if errors:
        raise ConfigError(errors)

    with transaction.atomic():
        run = Run.objects.create(name=name, mode=mode, config=run_config.to_dict(),
                                 created_by=user)
        Island.objects.bulk_create(
            Island(run=run, name=island.name, region=island.region, speed=island.speed,
                   batch_size=island.batch_size, bandwidth_gbps=island.bandwidth_gbps,
                   latency_ms=island.latency_ms)
            for island in run_config.islands)
    return run


# -- the runtime: islands on Celery workers, commands through Redis -----------------
#
# The database says what a run is (its config, its islands and their epochs); Redis
# carries what the running processes read (the spec, the current epochs, commands
# for the island supervisors, fault flags). Each service below changes the database
# first, where a bad request is refused, and then tells the processes.

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
LIVE_STATES = (Run.State.RUNNING, Run.State.PAUSED)


def start_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Start a draft run: publish its spec, give every island epoch 1 and enqueue it.

    Each island goes to its region's queue (trainer.queues.region_queue), where
    that region's worker runs it as one long task.

    Raises:
        ValueError: when the run is not a draft.
    """
    run.transition(Run.State.QUEUED, by=by)
    try:
        store = run_store(run)
        store.put_spec(run.mode, run.config, run.secret)
        islands = list(_live_islands(run))
        with transaction.atomic():
            for island in islands:
                island.epoch = 1
                island.save(update_fields=["epoch"])
        for island in islands:
            store.set_epoch(island.name, island.epoch)
        for island in islands:
            _enqueue(run, island)
    except Exception as e:
        run.transition(Run.State.FAILED, by=by, reason=f"The run could not be started: {e}")
        raise
    run.transition(Run.State.RUNNING, by=by)


def stop_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Stop a run for good: every island saves its cursor and exits; syncd lets it go.

    Raises:
        ValueError: when the run cannot be stopped from its state (a draft, or final).
    """
    run.transition(Run.State.STOPPED, by=by)
    store = run_store(run)
    for island in _live_islands(run):
        store.send_command(island.name, "stop", epoch=island.epoch)
    store.deactivate()


def pause_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Freeze every island process (SIGSTOP); it keeps its memory and its place."""
    run.transition(Run.State.PAUSED, by=by)
    run_store(run).set_paused(True)  # syncd: silent islands are paused, not lost
    _command_all(run, "pause")


def resume_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Let the islands of a paused run go on (SIGCONT)."""
    run.transition(Run.State.RUNNING, by=by)
    _command_all(run, "resume")
    run_store(run).set_paused(False)


def kill_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> Island:
    """Kill an island's process with SIGKILL, mid-step, on its own host."""
    _require_state(run, LIVE_STATES, "kill an island")
    island = _island(run, island)
    run_store(run).send_command(island.name, "kill", epoch=island.epoch)
    _event(run, island, Event.Kind.FAULT, by, fault="kill", epoch=island.epoch)
    return island


def kill_region(run: Run, region: str, by: AbstractBaseUser | None) -> list[Island]:
    """A region outage: every island of the run in that region is killed."""
    _require_state(run, LIVE_STATES, "kill a region")
    islands = [island for island in _live_islands(run) if island.region == region]
    if not islands:
        regions = sorted({island.region for island in _live_islands(run)})
        raise ValueError(f"run {run.name!r} has no island in region {region!r} "
                         f"(its regions: {', '.join(regions)})")
    store = run_store(run)
    for island in islands:
        store.send_command(island.name, "kill", epoch=island.epoch)
        _event(run, island, Event.Kind.FAULT, by, fault="kill", region=region,
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
    _require_state(run, (Run.State.RUNNING,), "inject a fault")
    island = _island(run, island)
    until = time.time() + seconds
    store = run_store(run)
    # The key outlives the fault a little, so the island reads its end from "until"
    # rather than from the key vanishing mid-read; then Redis forgets it.
    store.r.set(store.key("fault", island.name),
                json.dumps({"kind": kind, "until": until, "factor": factor}),
                ex=math.ceil(seconds) + 60)
    _event(run, island, Event.Kind.FAULT, by, fault=kind, seconds=seconds, factor=factor,
           until=until, epoch=island.epoch)
    return island


def rejoin_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> Island:
    """Start the island's next incarnation; the one before it, if it still runs, stops.

    The new incarnation pulls the newest global fragments and resumes from the
    island's data cursor; syncd refuses updates from the older epoch from now on.
    """
    _require_state(run, LIVE_STATES, "rejoin an island")
    island = _island(run, island)
    old_epoch = island.epoch
    store = run_store(run)
    store.send_command(island.name, "stop", epoch=old_epoch)
    store.rejoin_requested(island.name, time.time())  # syncd reports the time to train
    island = _next_incarnation(run, island, store)
    _event(run, island, Event.Kind.REJOIN, by, from_epoch=old_epoch, epoch=island.epoch)
    return island


def record_island_failure(run_id: int, island: str, result: dict[str, Any]) -> None:
    """An island process died on its own: an alert with its exit code and last log lines,
    so the control room can say why. A rejoin starts it again."""
    row = Island.objects.filter(run_id=run_id, name=island).first()
    Event.objects.create(run_id=run_id, island=row, kind=Event.Kind.ALERT,
                         detail={"message": f"island {island} epoch {result['epoch']} crashed "
                                            f"with exit code {result['exit_code']}",
                                 "log": result.get("log_tail", [])})


def checkpoint_now(run: Run, by: AbstractBaseUser | None) -> None:
    """Ask syncd for a checkpoint of the run at its next pass."""
    _require_state(run, LIVE_STATES, "checkpoint a run")
    run_store(run).request_checkpoint()
    Event.objects.create(run=run, kind=Event.Kind.CHECKPOINT, actor=by,
                         detail={"requested": True})


def kill_syncd(by: AbstractBaseUser) -> None:
    """Kill syncd with SIGKILL, wherever it runs; its supervisor brings it back.

    Only admins may: every run stalls until syncd is back.

    Raises:
        PermissionError: when `by` is not a superuser.
    """
    if not getattr(by, "is_superuser", False):
        raise PermissionError("Only admins may kill syncd.")
    from syncd.store import connect
    from syncd.store import kill_syncd as send_kill

    send_kill(connect(settings.REDIS_URL))
    for run in Run.objects.filter(state__in=LIVE_STATES):
        Event.objects.create(run=run, kind=Event.Kind.FAULT, actor=by,
                             detail={"fault": "kill_syncd"})


def add_island(run: Run, island_config: dict[str, Any], by: AbstractBaseUser | None) -> Island:
    """Add an island to a draft or a live run; in a live run it starts training at once.

    Raises:
        ConfigError: when the island does not fit the config (keyed "islands.N.name", ...).
        ValueError: when the run is neither a draft nor live.
    """
    _require_state(run, (Run.State.DRAFT, *LIVE_STATES), "add an island")
    config = parse_config({**run.config, "islands": [*run.config["islands"], island_config]},
                          settings.REGIONS)
    new = config.islands[-1]
    fields = {"region": new.region, "speed": new.speed, "batch_size": new.batch_size,
              "bandwidth_gbps": new.bandwidth_gbps, "latency_ms": new.latency_ms,
              "state": Island.State.PENDING, "fault": Island.Fault.NONE}
    with transaction.atomic():
        run.config = config.to_dict()
        run.save(update_fields=["config"])
        # A removed island keeps its row (and its epochs) for when it comes back.
        island, _ = Island.objects.update_or_create(run=run, name=new.name, defaults=fields)
    if run.state in LIVE_STATES:
        store = run_store(run)
        store.put_spec(run.mode, run.config, run.secret)
        island = _next_incarnation(run, island, store)
    return island


def remove_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> None:
    """Take an island out of a run; a running one saves its cursor and stops.

    Raises:
        ConfigError: when the run would be left with too few islands for its quorum.
        ValueError: when the run has no such island or is neither a draft nor live.
    """
    _require_state(run, (Run.State.DRAFT, *LIVE_STATES), "remove an island")
    island = _island(run, island)
    config = parse_config({**run.config, "islands": [
        i for i in run.config["islands"] if i["name"] != island.name]}, settings.REGIONS)
    with transaction.atomic():
        run.config = config.to_dict()
        run.save(update_fields=["config"])
        if run.state == Run.State.DRAFT:
            island.delete()
            return
        island = Island.objects.select_for_update().get(pk=island.pk)
        old_epoch = island.epoch
        # The next epoch, with no process behind it: syncd refuses the old one's
        # updates and its supervisor stops it, even if the stop below goes astray.
        island.epoch = old_epoch + 1
        island.state = Island.State.STOPPED
        island.save(update_fields=["epoch", "state"])
    store = run_store(run)
    store.put_spec(run.mode, run.config, run.secret)
    store.send_command(island.name, "stop", epoch=old_epoch)
    store.set_epoch(island.name, island.epoch)


def resume_after_restart() -> list[Run]:
    """After the whole system restarted: run every island of every live run again.

    Each island starts its next incarnation (so nothing left over from before the
    restart merges) and goes on from its data cursor; a paused run stays paused.
    Returns the runs it resumed.
    """
    runs = list(Run.objects.filter(state__in=LIVE_STATES).order_by("id"))
    for run in runs:
        store = run_store(run)
        store.put_spec(run.mode, run.config, run.secret)
        for island in _live_islands(run):
            _next_incarnation(run, island, store)
    return runs


def island_log(run: Run, island: Island | str, lines: int = 50) -> list[str]:
    """The last lines of an island's log on this host (its output and its tracebacks)."""
    name = island.name if isinstance(island, Island) else island
    return tail_lines(island_log_path(settings.LOG_DIR, run.pk, name), lines)


# -- helpers ------------------------------------------------------------------------

def _live_islands(run: Run) -> QuerySet[Island]:
    """The islands in the run's config (removed islands keep their rows)."""
    return run.islands.filter(name__in=[i["name"] for i in run.config.get("islands", [])])


def _island(run: Run, island: Island | str) -> Island:
    name = island.name if isinstance(island, Island) else island
    found = _live_islands(run).filter(name=name).first()
    if found is None:
        names = ", ".join(_live_islands(run).values_list("name", flat=True))
        raise ValueError(f"run {run.name!r} has no island named {name!r} (it has {names})")
    return found


def _require_state(run: Run, states: tuple[str, ...], action: str) -> None:
    run.refresh_from_db(fields=["state"])
    if run.state not in states:
        raise ValueError(f"cannot {action} of a run that is {run.state} "
                         f"(it must be {' or '.join(states)})")


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


def _next_incarnation(run: Run, island: Island, store: RunStore) -> Island:
    """The island's next epoch, in the database and Redis, and its task on the queue."""
    with transaction.atomic():
        # Under a row lock: two rejoins at once must not both start epoch n + 1.
        island = Island.objects.select_for_update().get(pk=island.pk)
        island.epoch += 1
        island.save(update_fields=["epoch"])
    store.set_epoch(island.name, island.epoch)
    if run.state == Run.State.PAUSED:
        # Queued first, so the new process is frozen as soon as it starts.
        store.send_command(island.name, "pause", epoch=island.epoch)
    _enqueue(run, island)
    return island


def _enqueue(run: Run, island: Island) -> None:
    run_island.apply_async(args=[run.pk, island.name, island.epoch, settings.REDIS_URL],
                           queue=region_queue(island.region))


def _command_all(run: Run, kind: str) -> None:
    store = run_store(run)
    for island in _live_islands(run):
        store.send_command(island.name, kind, epoch=island.epoch)


def _event(run: Run, island: Island, kind: str, by: AbstractBaseUser | None,
           **detail: Any) -> Event:
    return Event.objects.create(run=run, island=island, kind=kind, actor=by,
                                detail={"island": island.name, **detail})
