"""Celery tasks: thin glue around the island supervisor (trainer.supervisor) on the
regions' queues and the simulator's sweeps on the control queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import shared_task
from django.conf import settings

from trainer.queues import CONTROL_QUEUE
from trainer.supervisor import supervise_island
from webapp.runs.failures import record_island_failure
from webapp.runs.models import Simulation
from webapp.runs.simulations import run_simulation_now
from webapp.runs.stores import dataplane_url

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser


@shared_task(name="trainer.run_island", acks_late=True)
def run_island(run_id: int, island: str, epoch: int, redis_url: str, island_key: str,
               asked_at: float | None = None, redis_password: str | None = None
               ) -> dict[str, Any]:
    """One epoch of one island, on its region's queue, for as long as it trains;
    `island_key` is that epoch's key (hex), `asked_at` when its start or rejoin was
    asked for (its dispatch phase), `redis_password` the password of the run's island
    user (syncd/acl.py; None: the island connects with `redis_url`)."""
    result = supervise_island(run_id, island, epoch, redis_url, island_key, settings.LOG_DIR,
                              asked_at, redis_password, dataplane_url())
    if result["ended"] == "failed":
        record_island_failure(run_id, island, result)
    return result


@shared_task(name="runs.run_simulation")
def run_simulation(simulation_id: int) -> None:
    run_simulation_now(simulation_id)


def start_simulation(sweep: dict[str, Any], by: AbstractBaseUser | None) -> Simulation:
    """Save a checked sweep and queue it on the control queue."""
    simulation = Simulation.objects.create(spec=sweep, created_by=by)
    run_simulation.apply_async(args=[simulation.pk], queue=CONTROL_QUEUE)
    return simulation
