"""What the UI and the API do to runs; both call these functions and nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

from trainer.config import MODES, ConfigError, RunConfig, parse_config
from webapp.runs.models import RUN_NAME_MAX_LENGTH, Island, Run

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser


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
