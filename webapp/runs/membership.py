"""Which islands a run has: add one, remove one, rejoin one (start its next epoch).
Run.island_names says which islands a run has now."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

from diloco.config_parse import ConfigError, parse_config
from webapp.runs.dispatch import put_spec, start_next_epoch
from webapp.runs.models import Event, Island, Run
from webapp.runs.stores import run_store
from webapp.runs.validation import admitted_configs, memory_misfits

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from diloco.config import RunConfig


def with_islands(run: Run, islands: list[Any]) -> RunConfig:
    """The run's config with these islands, parsed; a sync run's quorum stays all of them."""
    data = {**run.config, "islands": islands}
    if run.mode == Run.Mode.SYNC:
        data["sync"] = {**run.config.get("sync", {}), "min_quorum": len(islands)}
    return parse_config(data, settings.REGIONS)


def add_island(run: Run, island_config: dict[str, Any], by: AbstractBaseUser | None) -> Island:
    """Add an island to a draft, or to a running or paused run, where it starts training
    at once.

    Raises:
        ConfigError: when the island does not fit the config (keyed "islands.N.name", ...),
            or the run with it does not fit the memory the hosts declare beside the
            other admitted runs (webapp.runs.validation.memory_misfits).
        WrongState: when the run is neither a draft nor running or paused.
    """
    run.require_state((Run.State.DRAFT, *Run.RUNNING_OR_PAUSED), "add an island")
    config = with_islands(run, [*run.config["islands"], island_config])
    if misfits := memory_misfits(config, admitted_configs(run)):
        raise ConfigError(misfits)
    new = config.islands[-1]
    fields = {"region": new.region, "speed": new.speed, "batch_size": new.batch_size,
              "bandwidth_gbps": new.bandwidth_gbps, "latency_ms": new.latency_ms,
              "state": Island.State.PENDING, "fault": Island.Fault.NONE}
    with transaction.atomic():
        run.config = config.to_dict()
        run.save(update_fields=["config"])
        # A removed island keeps its row (and its epochs) for when it comes back.
        island, _ = Island.objects.update_or_create(run=run, name=new.name, defaults=fields)
    if run.is_running_or_paused:
        store = run_store(run)
        put_spec(run, store)
        island = start_next_epoch(run, island, store)
    return island


def remove_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> None:
    """Take an island out of a run; a running one saves its cursor and stops.

    Raises:
        ConfigError: when the run would be left with too few islands for its quorum.
        ValueError: when the run has no such island.
        WrongState: when the run is neither a draft nor running or paused.
    """
    run.require_state((Run.State.DRAFT, *Run.RUNNING_OR_PAUSED), "remove an island")
    island = run.get_island(island)
    config = with_islands(run, [i for i in run.config["islands"] if i["name"] != island.name])
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
    store.signals.send_command(island.name, "stop", epoch=old_epoch)
    store.set_epoch(island.name, island.epoch)


def rejoin_island(run: Run, island: Island | str, by: AbstractBaseUser | None) -> Island:
    """Start the island's next epoch; the one before it, if it still runs, stops.

    The new epoch pulls the newest global fragments and resumes from the
    island's data cursor; syncd refuses updates from the older epoch from now on.
    """
    run.require_state(Run.RUNNING_OR_PAUSED, "rejoin an island")
    island = run.get_island(island)
    old_epoch = island.epoch
    store = run_store(run)
    store.signals.send_command(island.name, "stop", epoch=old_epoch)
    asked = time.time()
    store.control.request_rejoin(island.name, asked)  # syncd reports the time to train
    island = start_next_epoch(run, island, store, asked)
    island.record_event(Event.Kind.REJOIN, by, from_epoch=old_epoch, epoch=island.epoch)
    return island
