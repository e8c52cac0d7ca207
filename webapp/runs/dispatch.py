"""How a run's processes are told what to run and where: the spec in Redis, the Redis
user its islands connect as (syncd/acl.py), and each island epoch's start on a warm
standby or a Celery worker.

The database says what a run is (its config, its islands and their epochs); Redis
carries what the running processes read (the spec, the current epochs, commands
for the island supervisors, fault flags). Each run service changes the database
first, where a bad request is refused, and then tells the processes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

from diloco.signing import island_key
from syncd.acl import put_island_users
from trainer.claims import claims_key, sign_claim
from trainer.queues import region_queue
from webapp.runs.models import Island, Run
from webapp.runs.stores import pool_store, run_store
from webapp.runs.tasks import run_island

if TYPE_CHECKING:
    from syncd.store import RunStore


def put_spec(run: Run, store: RunStore) -> None:
    """Publish what the run's processes read; the starting checkpoint travels as its
    path and sha256, which syncd verifies."""
    start = run.initial_checkpoint
    store.put_spec(run.mode, run.config, run.secret,
                   {"path": start.path, "sha256": start.sha256} if start else None)


def put_island_user_of(run: Run) -> tuple[str | None, str | None]:
    """Make (again) the Redis user of the run's islands on the control plane and the data
    plane: (its password, None), or (None, why there is none: a Redis without ACL), when
    islands get the launchers' URLs."""
    store = run_store(run)
    return put_island_users(store.client, store.data, run.pk, bytes.fromhex(run.secret))


def start_next_epoch(run: Run, island: Island, store: RunStore,
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
        store.signals.send_command(island.name, "pause", epoch=island.epoch)
    enqueue(run, island, asked_at)
    return island


def enqueue(run: Run, island: Island, asked_at: float | None = None) -> None:
    """Start the island's current epoch: on a warm standby of its region when one is
    ready, else as a task on its region's queue (today's cold start). Either launcher
    gets the password of the run's island user, made again first (Redis forgets users
    when it restarts), and builds the island's URL from its own (syncd.acl.island_url)."""
    asked = time.time() if asked_at is None else asked_at
    password, _ = put_island_user_of(run)
    if claim_standby(run, island, asked, password):
        return
    run_island.apply_async(args=[run.pk, island.name, island.epoch, settings.REDIS_URL,
                                 island_key_hex(run, island)],
                           kwargs={"asked_at": asked, "redis_password": password},
                           queue=region_queue(island.region))


def claim_standby(run: Run, island: Island, asked_at: float,
                  redis_password: str | None = None) -> bool:
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
         "island_key": island_key_hex(run, island), "redis_password": redis_password},
        claims_key(settings.SECRET_KEY)))
    return True


def island_key_hex(run: Run, island: Island) -> str:
    """The key of the island's current epoch (diloco.signing.island_key), which its
    process signs its updates with: it is given that, never the run's secret."""
    return island_key(bytes.fromhex(run.secret), island.name, island.epoch).hex()
