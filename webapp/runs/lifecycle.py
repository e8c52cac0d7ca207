"""A run's life: create, start, stop, pause, resume, checkpoint, archive, delete.

The UI and the API call these functions and nothing else (the islands of a run:
webapp/runs/membership.py; faults: webapp/runs/faults.py).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from diloco.config import RUN_MODES, RunConfig, mode_problems, with_mode_values
from diloco.config_parse import ConfigError, parse_config
from syncd.acl import delete_island_users
from syncd.keys import run_prefix
from syncd.published_files import PublishedFiles
from webapp.runs import starting
from webapp.runs.models import (
    RUN_NAME_MAX_LENGTH,
    Checkpoint,
    Event,
    Island,
    Run,
)
from webapp.runs.stores import run_store
from webapp.runs.validation import (
    admitted_configs,
    check_corpus_path,
    check_corpus_size,
    check_model_folder,
    check_tokenizer_folder,
    checkpoint_misfit,
    memory_misfits,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

log = logging.getLogger("archipelago.web")


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
        mode: one of diloco.config.RUN_MODES.
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
    if mode not in RUN_MODES:
        errors["mode"] = [f"Must be one of {', '.join(RUN_MODES)}, got {mode!r}."]
    if user is not None and (folders := _folder_errors(config)):
        raise ConfigError({**errors, **folders})  # before their config.json is read
    run_config = None
    try:
        run_config = with_mode_values(mode, parse_config(config, settings.REGIONS), config)
    except ConfigError as e:
        for path, messages in e.errors.items():
            # An unknown top-level config key "name" or "mode" must not read as a
            # problem with the run's own name or mode.
            key = f"config.{path}" if path in ("name", "mode") else path
            errors.setdefault(key, []).extend(messages)
    else:
        errors.update(memory_misfits(run_config, admitted_configs()),
                      **{path: [problem] for path, problem in mode_problems(mode, run_config)})
    # What a user names must stay inside the data folders; the system's own runs (user
    # None: the demo, benchmarks, tests) may read their own corpora.
    message = _corpus_error(config, run_config, errors) if user is not None else ""
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


def _corpus_error(config: Any, run_config: RunConfig | None,
                  errors: dict[str, list[str]]) -> str:
    """Why a user's run may not read its corpus: outside DATA_ROOTS, or (once the rest
    of the config is sound) smaller than one batch."""
    if "data.path" in errors:
        return ""
    return check_corpus_path(config) or ("" if errors else check_corpus_size(run_config))


def _folder_errors(config: Any) -> dict[str, list[str]]:
    """The folders a user's config names outside DATA_ROOTS, by field: refused before
    parse_config reads their config.json and tokenizer.json."""
    return {field: [message] for field, message in (
        ("model.hf_config", check_model_folder(config)),
        ("data.tokenizer", check_tokenizer_folder(config))) if message}


def start_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Start a draft and wait for it to be running: publish its spec, give every island
    epoch 1, wait a bounded time for its regions' pools to fill and start its islands
    (webapp/runs/starting.py). The system's own starts (the demo, benchmarks, tests)
    call this; a user's start is request_start.

    Each island claims a warm standby of its region's pool when one is ready
    (trainer/pool_manager.py), else goes to its region's queue
    (trainer.queues.region_queue), where that region's worker runs it as one long
    task. Its islands connect as the run's own Redis user (syncd/acl.py); where Redis
    makes none (no ACL), an alert says so and they connect as the control plane.

    Raises:
        ConfigError: when the run does not fit the memory the hosts declare beside the
            admitted runs (webapp.runs.validation.memory_misfits).
        WrongState: when the run is not a draft.
    """
    starting.begin_start(run, by)
    starting.finish_start(run, by)


def request_start(run: Run, by: AbstractBaseUser | None) -> None:
    """Start a draft and return at once, the run `queued`: the wait for the pools and
    the islands' start run on the control worker, and the run's `start_progress` says
    where they are (queued, filling_pools, starting_islands, started).

    Raises:
        ConfigError, WrongState: as start_run.
    """
    starting.begin_start(run, by)
    starting.finish_start_later(run, by)


def stop_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Stop a run for good, keeping its model: the run is `stopping` while every island
    sends what it has not sent and exits, and syncd merges what arrived, writes a final
    checkpoint, sets the islands' states, frees the run's Redis keys but its status
    and makes the run `stopped` (syncd/service.py).

    Raises:
        WrongState: when the run cannot be stopped from its state (a draft, stopping, or
            final).
    """
    run.transition(Run.State.STOPPING, by=by)
    store = run_store(run)
    store.control.request_stop(time.time())
    # a paused run's islands thaw to stop (the supervisor's SIGCONT)
    store.control.set_paused(False)
    _command_all(run, "stop")


# A pause checkpoints unless the run has a checkpoint at most this old.
PAUSE_CHECKPOINT_AGE_S = 60.0


def pause_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Freeze every island process (SIGSTOP); it keeps its memory and its place. syncd
    checkpoints the run unless it has a checkpoint newer than a minute."""
    run.transition(Run.State.PAUSED, by=by)
    store = run_store(run)
    store.control.set_paused(True)  # syncd: silent islands are paused, not lost
    _command_all(run, "pause")
    recent = timezone.now() - timedelta(seconds=PAUSE_CHECKPOINT_AGE_S)
    if not Checkpoint.objects.filter(run=run, created_at__gte=recent).exists():
        store.control.request_checkpoint()


def resume_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Let the islands of a paused run go on (SIGCONT)."""
    run.transition(Run.State.RUNNING, by=by)
    _command_all(run, "resume")
    run_store(run).control.set_paused(False)


def checkpoint_now(run: Run, by: AbstractBaseUser | None) -> None:
    """Ask syncd for a checkpoint of the run at its next pass."""
    run.require_state(Run.RUNNING_OR_PAUSED, "checkpoint a run")
    run_store(run).control.request_checkpoint()
    Event.objects.create(run=run, kind=Event.Kind.CHECKPOINT, actor=by,
                         detail={"requested": True})


def archive_run(run: Run, archived: bool, by: AbstractBaseUser | None) -> None:
    """Hide a run from the runs list (or show it again); it is kept whole."""
    Run.objects.filter(pk=run.pk).update(archived=archived)
    run.archived = archived


def delete_run(run: Run, by: AbstractBaseUser | None) -> None:
    """Delete a run that is a draft or final, with its events, metrics, checkpoints and syncd's
    files of its published fragments; a checkpoint another run started from is kept
    (detached from the run).

    The run's checkpoint files and Redis keys go once the deletion is committed (at
    once, or when the caller's transaction commits), outside any transaction: the
    database is never held while Redis is scanned, and a Redis that cannot be reached
    then does not bring the run back; its keys are left, and said so in the log.

    Raises:
        WrongState: when the run is queued, running, paused or stopping: stop it first.
    """
    run.require_state((Run.State.DRAFT, *Run.FINAL), "delete a run")
    run_id = run.pk
    with transaction.atomic():
        kept = Checkpoint.objects.filter(run=run, started_runs__isnull=False).distinct()
        kept.update(run=None)
        doomed = list(Checkpoint.objects.filter(run=run).values_list("path", flat=True))
        Checkpoint.objects.filter(run=run).delete()
        run.delete()
        transaction.on_commit(lambda: _free_deleted_run(run_id, doomed))


def _free_deleted_run(run_id: int, checkpoint_paths: list[str]) -> None:
    for path in checkpoint_paths:
        Path(path).unlink(missing_ok=True)
    PublishedFiles.of_run(settings.CHECKPOINT_DIR, run_id).clear()  # syncd's, if any left
    try:
        store = run_store(run_id)
        store.release(keep=())
        delete_island_users(store.client, store.data, run_id)
    except redis.RedisError as e:
        log.error("run %d is deleted but its Redis keys (%s*) are left: %s", run_id,
                  run_prefix(run_id), e)


def _command_all(run: Run, kind: str) -> None:
    store = run_store(run)
    for island in run.current_islands():
        store.signals.send_command(island.name, kind, epoch=island.epoch)
