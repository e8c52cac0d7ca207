"""Bounds on what islands write (syncd/key_bounds.py), against a RunSync on real Redis:
as the run's real island user (syncd/acl.py), floods of heartbeat fields, cursors and
faults of no island, values over the signals' bound and chunks without a TTL are
deleted at syncd's next look, one rejection event per cause, and the run goes on
merging; what its islands write honestly stays."""

from __future__ import annotations

import json

import pytest

from diloco.signing import redis_password
from syncd.acl import island_store, island_url, put_island_users
from syncd.island_signals import MAX_SIGNAL_BYTES
from syncd.key_bounds import BOUNDS_EVERY_S, MAX_SCAN
from tests.syncd.runs import heartbeat_all, make_run_sync, send
from webapp.runs.models import Event

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def sync(redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "decoupled")
    put_island_users(sync.store.client, sync.store.client, sync.store.run_id,
                     sync.spec.secret)
    return sync


def island_writer(redis_url, sync):
    """What the run's island user may write with, as an island holds it."""
    url = island_url(redis_url, sync.store.run_id, redis_password(sync.spec.secret))
    return island_store(url, url, sync.store.run_id).writer


def look(sync) -> None:
    sync.clock_state["now"] += BOUNDS_EVERY_S
    sync.tick()
    sync.recorder.flush()


def causes(sync) -> dict[str, int]:
    """What the rejection events say was deleted, summed by cause."""
    deleted: dict[str, int] = {}
    for e in Event.objects.filter(run_id=int(sync.store.run_id), kind="rejection"):
        if "deleted" in e.detail:
            cause = e.detail["cause"]
            deleted[cause] = deleted.get(cause, 0) + e.detail["deleted"]
    return deleted


def test_floods_of_heartbeats_cursors_and_faults_of_no_island_are_deleted(redis_url, sync):
    writer = island_writer(redis_url, sync)
    store = sync.store
    heartbeat_all(sync)
    store.signals.save_cursor("a", {"position": 12})
    junk = {f"junk-{i}": "x" * 100 for i in range(MAX_SCAN + 2000)}
    for i in range(0, len(junk), 5000):
        writer.hset(store.key("heartbeats"), mapping=dict(list(junk.items())[i:i + 5000]))
    for i in range(300):
        writer.set(store.key("cursor", f"junk-{i}"), "x" * 1000)
        writer.set(store.key("fault", f"junk-{i}"), "x" * 1000)

    look(sync)
    sync.clock_state["now"] += 60  # the second look's event comes a minute after the first
    look(sync)  # a flood over MAX_SCAN takes two looks

    assert sorted(store.client.hkeys(store.key("heartbeats"))) == [b"a", b"b"]
    assert store.client.keys(store.key("cursor", "*")) == [store.key("cursor", "a").encode()]
    assert store.client.keys(store.key("fault", "*")) == []
    assert store.signals.cursor("a") == {"position": 12}
    assert causes(sync) == {"heartbeat_of_no_island": len(junk), "cursor_of_no_island": 300,
                            "fault_of_no_island": 300}


def test_an_island_value_over_the_bound_is_deleted_and_its_island_goes_on_merging(
        redis_url, sync):
    writer = island_writer(redis_url, sync)
    store = sync.store
    heartbeat_all(sync)
    huge = json.dumps({"epoch": 1, "time": 0, "pad": "x" * (MAX_SIGNAL_BYTES + 1)})
    writer.hset(store.key("heartbeats"), "a", huge)
    writer.set(store.key("cursor", "b"), huge)
    writer.set(store.key("blob", "a", 1, 0, 999, 0), "x" * 100)  # no TTL: no island's
    writer.set(store.key("blob", "a", 1, 0, 998, 0), "x" * (1 << 20), ex=3600)  # > a chunk

    look(sync)

    assert store.client.hstrlen(store.key("heartbeats"), "a") == 0
    assert not store.client.exists(store.key("cursor", "b"))
    assert store.data.keys(store.key("blob", "*")) == []
    assert causes(sync) == {"heartbeat_too_long": 1, "cursor_too_long": 1,
                            "chunk_out_of_bounds": 2}
    before = store.globals.versions()[0]
    heartbeat_all(sync)
    send(sync, "a", 0, 4, base_version=before)
    send(sync, "b", 0, 4, base_version=before)
    sync.tick()
    assert store.globals.versions()[0] == before + 1
