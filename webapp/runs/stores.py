"""A run's Redis keys (syncd.store.RunStore) on the Redis that settings.REDIS_URL names,
its tensor messages on settings.DATAPLANE_REDIS_URL's.

The run services take their store from here and nowhere else, so a test that
points settings.REDIS_URL at its own Redis moves every service with it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import redis
from django.conf import settings

from syncd.connection import connect
from syncd.pool_store import PoolStore
from syncd.store import RunStore

if TYPE_CHECKING:
    from webapp.runs.models import Run


@lru_cache(maxsize=8)
def redis_client(url: str) -> redis.Redis:
    """One connection pool per URL for the whole process."""
    return connect(url)


def dataplane_url() -> str:
    """Where tensor messages lie: DATAPLANE_REDIS_URL, else the one Redis of REDIS_URL."""
    return settings.DATAPLANE_REDIS_URL or settings.REDIS_URL


def run_store(run: Run | int) -> RunStore:
    run_id = run if isinstance(run, int) else run.pk
    return RunStore(redis_client(settings.REDIS_URL), run_id,
                    data=redis_client(dataplane_url()))


def pool_store() -> PoolStore:
    """The hosts' pools of warm standby islands (trainer/pool_manager.py)."""
    return PoolStore(redis_client(settings.REDIS_URL))
