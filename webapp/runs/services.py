"""What the UI and the API do to runs; both call these functions and nothing else."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from diloco.config import MODES, ConfigError, RunConfig, parse_config
from diloco.signing import island_key
from trainer.claims import claims_key, sign_claim
from trainer.island_logs import island_log_path, tail_lines
from trainer.queues import region_queue
from webapp.runs.models import (
    FINAL_STATES,
    RUN_NAME_MAX_LENGTH,
    Checkpoint,
    Event,
    Island,
    Run,
)
from webapp.runs.stores import pool_store, run_store
from webapp.runs.tasks import run_island
from webapp.runs.validation import check_data_path, checkpoint_misfit, memory_misfits

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


def create_run(*, name: Any, mode: Any, config: Any, user: AbstractBaseUser | None,
               initial_checkpoint: Checkpoint | None = None) -> Run:
    """Validate a new run and save it as a draft with one island row per configured island.

    Args:
        name: the run's name, 1 to 100 characters.
        mode: one of diloco.config.MODES.
        config: the run config as decoded JSON; missing fields take their defaults.
        user: who creates it, or None.
        initial_checkpoint: a stored checkpoint the run's global model starts from; its
            model settings must be the run's.

    Raises:
        ConfigError: with every problem found, keyed "name", "mode", "initial_checkpoint"
            or by the config's dotted path ("sync.min_quorum").
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
    else:
        errors.update(memory_misfits(run_config))
    # What a user names must stay inside the data folders; the system's own runs (user
    # None: the demo, benchmarks, tests) may read their own corpora.
    data = config.get("data") if isinstance(config, dict) else None
    path = data.get("path") if isinstance(data, dict) else None
    if user is not None and isinstance(path, str) and "data.path" not in errors:
        message = check_data_path(path)
        if message:
            errors["data.path"] = [message]
    if initial_checkpoint is not None and "model" not in errors:
        message = checkpoint_misfit(initial_checkpoint, config)
        if message:
            errors["initial_checkpoint"] = [message]
    if errors:
        raise ConfigError(errors)

    with transaction.atomic():
        run = Run.objects.create(name=name, mode=mode, config=run_config.to_dict(),
                                 created_by=user, initial_checkpoint=initial_checkpoint)
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

RUNNING_OR_PAUSED = (Run.State.RUNNING, Run.State.PAUSED)


def start_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Start a draft run: publish its spec, give every island epoch 1 and enqueue it.

    Each island claims a warm standby of its region's pool when one is ready
    (trainer/pool_manager.py), else goes to its region's queue
    (trainer.queues.region_queue), where that region's worker runs it as one long
    task.

    Raises:
        ConfigError: when the run no longer fits the memory the hosts declare.
        ValueError: when the run is not a draft.
    """
    if run.state == Run.State.DRAFT and (misfits := memory_misfits(run.run_config())):
        raise ConfigError(misfits)
    run.transition(Run.State.QUEUED, by=by)
    try:
        store = run_store(run)
        put_spec(run, store)
        islands = list(live_islands(run))
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
    """Stop a run for good, keeping its model: the run is `stopping` while every island
    sends what it has not sent and exits, and syncd merges what arrived, writes a final
    checkpoint, sets the islands' states, frees the run's Redis keys but its status
    and makes the run `stopped` (syncd/service.py).

    Raises:
        ValueError: when the run cannot be stopped from its state (a draft, stopping, or
            final).
    """
    run.transition(Run.State.STOPPING, by=by)
    store = run_store(run)
    store.request_stop(time.time())
    store.set_paused(False)  # a paused run's islands thaw to stop (the supervisor's SIGCONT)
    _command_all(run, "stop")


# A pause checkpoints unless the run has a checkpoint at most this old.
PAUSE_CHECKPOINT_AGE_S = 60.0


def pause_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Freeze every island process (SIGSTOP); it keeps its memory and its place. syncd
    checkpoints the run unless it has a checkpoint newer than a minute."""
    run.transition(Run.State.PAUSED, by=by)
    store = run_store(run)
    store.set_paused(True)  # syncd: silent islands are paused, not lost
    _command_all(run, "pause")
    recent = timezone.now() - timedelta(seconds=PAUSE_CHECKPOINT_AGE_S)
    if not Checkpoint.objects.filter(run=run, created_at__gte=recent).exists():
        store.request_checkpoint()


def resume_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Let the islands of a paused run go on (SIGCONT)."""
    run.transition(Run.State.RUNNING, by=by)
    _command_all(run, "resume")
    run_store(run).set_paused(False)


def rejoin_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> Island:
    """Start the island's next epoch; the one before it, if it still runs, stops.

    The new epoch pulls the newest global fragments and resumes from the
    island's data cursor; syncd refuses updates from the older epoch from now on.
    """
    require_state(run, RUNNING_OR_PAUSED, "rejoin an island")
    island = get_island(run, island)
    old_epoch = island.epoch
    store = run_store(run)
    store.send_command(island.name, "stop", epoch=old_epoch)
    asked = time.time()
    store.rejoin_requested(island.name, asked)  # syncd reports the time to train
    island = _next_epoch(run, island, store, asked)
    record_event(run, island, Event.Kind.REJOIN, by, from_epoch=old_epoch, epoch=island.epoch)
    return island


def checkpoint_now(run: Run, by: AbstractBaseUser | None) -> None:
    """Ask syncd for a checkpoint of the run at its next pass."""
    require_state(run, RUNNING_OR_PAUSED, "checkpoint a run")
    run_store(run).request_checkpoint()
    Event.objects.create(run=run, kind=Event.Kind.CHECKPOINT, actor=by,
                         detail={"requested": True})


def add_island(run: Run, island_config: dict[str, Any], by: AbstractBaseUser | None) -> Island:
    """Add an island to a draft or a live run; in a live run it starts training at once.

    Raises:
        ConfigError: when the island does not fit the config (keyed "islands.N.name", ...).
        ValueError: when the run is neither a draft nor live.
    """
    require_state(run, (Run.State.DRAFT, *RUNNING_OR_PAUSED), "add an island")
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
    if run.state in RUNNING_OR_PAUSED:
        store = run_store(run)
        put_spec(run, store)
        island = _next_epoch(run, island, store)
    return island


def remove_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> None:
    """Take an island out of a run; a running one saves its cursor and stops.

    Raises:
        ConfigError: when the run would be left with too few islands for its quorum.
        ValueError: when the run has no such island or is neither a draft nor live.
    """
    require_state(run, (Run.State.DRAFT, *RUNNING_OR_PAUSED), "remove an island")
    island = get_island(run, island)
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
    put_spec(run, store)
    store.send_command(island.name, "stop", epoch=old_epoch)
    store.set_epoch(island.name, island.epoch)


def resume_after_restart() -> list[Run]:
    """After the whole system restarted: run every island of every live run again.

    Each island starts its next epoch (so nothing left over from before the
    restart merges) and goes on from its data cursor; a paused run stays paused.
    The interval the run lost is an "alert" event on its timeline (lost_interval).
    Returns the runs it resumed.
    """
    runs = list(Run.objects.filter(state__in=RUNNING_OR_PAUSED).order_by("id"))
    for run in runs:
        store = run_store(run)
        Event.objects.create(run=run, kind=Event.Kind.ALERT,
                             detail=lost_interval(store, time.time()))
        put_spec(run, store)
        for island in live_islands(run):
            _next_epoch(run, island, store)
    return runs


def lost_interval(store: RunStore, now: float) -> dict[str, Any]:
    """What a restart of the whole system cost a run, as an event's detail.

    The system went down at the last sign of life the run left in Redis (its
    islands' heartbeats, syncd's status snapshot), which the project's Redis keeps
    across a crash in its append-only file; it is back at `now`.
    """
    marks = [float(b["time"]) for b in store.heartbeats().values() if "time" in b]
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


def archive_run(run: Run, archived: bool, by: AbstractBaseUser | None) -> None:
    """Hide a run from the runs list (or show it again); it is kept whole."""
    Run.objects.filter(pk=run.pk).update(archived=archived)
    run.archived = archived


def delete_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Delete a run that is not live, with its events, metrics and checkpoints; a
    checkpoint another run started from is kept (detached from the run).

    Raises:
        ValueError: when the run is queued, running or paused: stop it first.
    """
    require_state(run, (Run.State.DRAFT, *FINAL_STATES), "delete a run")
    with transaction.atomic():
        kept = Checkpoint.objects.filter(run=run, started_runs__isnull=False).distinct()
        kept.update(run=None)
        doomed = list(Checkpoint.objects.filter(run=run).values_list("path", flat=True))
        Checkpoint.objects.filter(run=run).delete()
        run_store(run).release(keep=())
        run.delete()
    for path in doomed:
        Path(path).unlink(missing_ok=True)


def put_spec(run: Run, store: RunStore) -> None:
    """Publish what the run's processes read; the starting checkpoint travels as its
    path and sha256, which syncd verifies."""
    start = run.initial_checkpoint
    store.put_spec(run.mode, run.config, run.secret,
                   {"path": start.path, "sha256": start.sha256} if start else None)


def island_log(run: Run, island: Island | str, lines: int = 50) -> list[str]:
    """The last lines of an island's log (its output and its tracebacks): what its
    supervisor last put in Redis, wherever it runs, else the file on this host."""
    name = island.name if isinstance(island, Island) else island
    shipped = run_store(run).log(name)
    if shipped is not None:
        return shipped[-lines:]
    return tail_lines(island_log_path(settings.LOG_DIR, run.pk, name), lines)


# -- helpers ------------------------------------------------------------------------

def live_islands(run: Run) -> QuerySet[Island]:
    """The islands in the run's config (removed islands keep their rows)."""
    return run.islands.filter(name__in=[i["name"] for i in run.config.get("islands", [])])


def get_island(run: Run, island: Island | str) -> Island:
    name = island.name if isinstance(island, Island) else island
    found = live_islands(run).filter(name=name).first()
    if found is None:
        names = ", ".join(live_islands(run).values_list("name", flat=True))
        raise ValueError(f"run {run.name!r} has no island named {name!r} (it has {names})")
    return found


def require_state(run: Run, states: tuple[str, ...], action: str) -> None:
    run.refresh_from_db(fields=["state"])
    if run.state not in states:
        raise ValueError(f"cannot {action}: the run is {run.state} "
                         f"(it must be {' or '.join(states)})")


def _next_epoch(run: Run, island: Island, store: RunStore,
                      asked_at: float | None = None) -> Island:
    """The island's next epoch, in the database and Redis, and its start: a claim of a
    warm standby or a task on the queue (`asked_at`: when it was asked for)."""
    with transaction.atomic():
        # Under a row lock: two rejoins at once must not both start epoch n + 1.
        island = Island.objects.select_for_update().get(pk=island.pk)
        island.epoch += 1
        island.save(update_fields=["epoch"])
    store.set_epoch(island.name, island.epoch)
    if run.state == Run.State.PAUSED:
        # Queued first, so the new process is frozen as soon as it starts.
        store.send_command(island.name, "pause", epoch=island.epoch)
    _enqueue(run, island, asked_at)
    return island


def _enqueue(run: Run, island: Island, asked_at: float | None = None) -> None:
    """Start the island's current epoch: on a warm standby of its region when one is
    ready, else as a task on its region's queue (today's cold start)."""
    asked = time.time() if asked_at is None else asked_at
    if claim_standby(run, island, asked):
        return
    run_island.apply_async(args=[run.pk, island.name, island.epoch, settings.REDIS_URL,
                                 island_key_hex(run, island)],
                           kwargs={"asked_at": asked}, queue=region_queue(island.region))


def claim_standby(run: Run, island: Island, asked_at: float) -> bool:
    """Claim a warm standby for the island's current epoch if its region's pool has one
    ready; False when it has none (or the island has several processes: standbys are
    one process each). The claim goes straight to the region's pool managers through
    Redis, never behind the busy tasks of the region's queue, signed (trainer/claims.py)
    so that a manager starts nothing for a claim that is not the run service's; a
    manager that finds its pool empty by then starts the island cold itself."""
    config = next((i for i in run.config.get("islands", []) if i["name"] == island.name), {})
    pools = pool_store()
    if config.get("processes", 1) > 1 or pools.ready(island.region) < 1:
        return False
    pools.push_claim(island.region, sign_claim(
        {"run": run.pk, "island": island.name, "epoch": island.epoch, "asked_at": asked_at,
         "island_key": island_key_hex(run, island)}, claims_key(settings.SECRET_KEY)))
    return True


def island_key_hex(run: Run, island: Island) -> str:
    """The key of the island's current epoch (diloco.signing.island_key), which its
    process signs its updates with: it is given that, never the run's secret."""
    return island_key(bytes.fromhex(run.secret), island.name, island.epoch).hex()


def _command_all(run: Run, kind: str) -> None:
    store = run_store(run)
    for island in live_islands(run):
        store.send_command(island.name, kind, epoch=island.epoch)


def record_event(run: Run, island: Island, kind: str, by: AbstractBaseUser | None,
           **detail: Any) -> Event:
    return Event.objects.create(run=run, island=island, kind=kind, actor=by,
                                detail={"island": island.name, **detail})
