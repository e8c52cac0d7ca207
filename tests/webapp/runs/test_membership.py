"""An island added to, removed from and rejoined to a run (webapp/runs/membership.py),
against a real Redis (the tests' own) and the real database.

Island tasks are recorded instead of sent (the `enqueued` fixture): what a region's
worker then does with one is the supervisor's business (tests/trainer).
"""

import json
import time

import pytest

from diloco.config_parse import ConfigError
from diloco.signing import island_key
from syncd.connection import connect
from syncd.pool_store import PoolStore
from tests.webapp.runs.three_islands import commands
from trainer.claims import claim_signed, claims_key
from webapp.runs.faults import kill_island
from webapp.runs.membership import add_island, rejoin_island, remove_island
from webapp.runs.models import Event, Island

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def test_a_rejoin_claims_a_warm_standby_when_the_regions_pool_has_one_ready(
        running, store, enqueued, redis_url, operator, settings):
    pools = PoolStore(connect(redis_url))
    pools.put_host("us-west", "host-1", {"ready": 1, "size": 1, "time": time.time()})

    before = time.time()
    rejoin_island(running, "west-a", operator)

    assert enqueued == []  # never behind the busy tasks of the region's queue
    ((_, claim),) = pools.take_claims("us-west", "host-1", 0.1)
    assert (claim["run"], claim["island"], claim["epoch"]) == (running.pk, "west-a", 2)
    assert before <= claim["asked_at"] <= time.time()
    assert claim["island_key"] == island_key(bytes.fromhex(running.secret), "west-a", 2).hex()
    assert running.secret not in json.dumps(claim)
    assert claim_signed(claim, claims_key(settings.SECRET_KEY))


def test_with_the_pool_empty_or_its_host_silent_a_rejoin_is_a_cold_start(
        running, enqueued, redis_url, operator):
    pools = PoolStore(connect(redis_url))
    pools.put_host("us-west", "empty", {"ready": 0, "size": 1, "time": time.time()})
    pools.put_host("us-west", "gone", {"ready": 1, "size": 1, "time": time.time() - 60})

    rejoin_island(running, "west-a", operator)

    assert [task["queue"] for task in enqueued] == ["region.us-west"]
    assert pools.take_claims("us-west", "host-1", 0.1) == []


def test_rejoin_stops_the_old_epoch_and_enqueues_the_next_epoch(running, store,
                                                                      enqueued, redis_url,
                                                                      operator):
    island = rejoin_island(running, "west-a", operator)

    s = store(running)
    assert island.epoch == 2
    assert Island.objects.get(run=running, name="west-a").epoch == 2
    assert s.epochs()["west-a"] == 2
    assert commands(s, "west-a") == [{"kind": "stop", "epoch": 1}]
    key = island_key(bytes.fromhex(running.secret), "west-a", 2).hex()
    assert enqueued == [{"args": [running.pk, "west-a", 2, redis_url, key],
                         "queue": "region.us-west"}]
    event = Event.objects.get(run=running, kind=Event.Kind.REJOIN)
    assert (event.island, event.actor, event.detail["from_epoch"], event.detail["epoch"]) == (
        island, operator, 1, 2)


def test_an_island_added_to_a_running_run_starts_training(running, store, enqueued,
                                                          redis_url, operator):
    island = add_island(running, {"name": "west-b", "region": "us-west", "speed": 0.5},
                        operator)

    running.refresh_from_db()
    assert [i["name"] for i in running.config["islands"]][-1] == "west-b"
    assert (island.region, island.speed, island.epoch) == ("us-west", 0.5, 1)
    s = store(running)
    assert s.spec()["config"] == running.config
    assert s.epochs()["west-b"] == 1
    key = island_key(bytes.fromhex(running.secret), "west-b", 1).hex()
    assert enqueued == [{"args": [running.pk, "west-b", 1, redis_url, key],
                         "queue": "region.us-west"}]


def test_an_island_that_does_not_fit_the_config_is_refused(running, enqueued, operator):
    with pytest.raises(ConfigError) as e:
        add_island(running, {"name": "east-a", "region": "mars"}, operator)

    assert set(e.value.errors) == {"islands.3.name", "islands.3.region"}
    assert enqueued == []


def test_a_removed_island_stops_and_its_epoch_is_fenced(running, store, operator):
    remove_island(running, "east-b", operator)

    running.refresh_from_db()
    assert [i["name"] for i in running.config["islands"]] == ["east-a", "west-a"]
    s = store(running)
    assert s.spec()["config"] == running.config
    assert commands(s, "east-b") == [{"kind": "stop", "epoch": 1}]
    assert s.epochs()["east-b"] == 2  # updates of epoch 1 are refused from now on
    row = Island.objects.get(run=running, name="east-b")
    assert (row.state, row.epoch) == (Island.State.STOPPED, 2)
    with pytest.raises(ValueError, match="no island named 'east-b'"):
        kill_island(running, "east-b", operator)


def test_an_island_cannot_be_removed_below_the_quorum(running, operator):
    remove_island(running, "east-b", operator)

    with pytest.raises(ConfigError) as e:
        remove_island(running, "west-a", operator)

    assert e.value.errors == {
        "sync.min_quorum": ["Must be between 1 and the number of islands (1), got 2."]}


def test_a_removed_island_can_come_back_with_its_next_epoch(running, store, enqueued,
                                                            operator):
    remove_island(running, "east-b", operator)

    island = add_island(running, {"name": "east-b", "region": "us-east"}, operator)

    assert (island.state, island.epoch) == (Island.State.PENDING, 3)
    assert store(running).epochs()["east-b"] == 3
    assert [call["args"][1:3] for call in enqueued] == [["east-b", 3]]


def test_an_island_added_to_a_running_run_must_fit_its_regions_host_beside_the_others(
        running, store, enqueued, operator, settings):
    """us-east's host of 30 MiB holds the run's two islands there (13 MiB each) and not
    a third: the add is refused, keyed by the new island's region, and nothing starts."""
    settings.ISLAND_HOST_MEMORY_MB, settings.ISLAND_POOL_SIZE = 30, None  # no standbys

    with pytest.raises(ConfigError) as refused:
        add_island(running, {"name": "east-c", "region": "us-east"}, operator)

    assert list(refused.value.errors) == ["islands.3.region"]
    assert refused.value.errors["islands.3.region"][0].startswith(
        "The island host of us-east would need about 39 MiB for this run's islands there "
        "('east-a', 'east-b', 'east-c')")
    running.refresh_from_db()
    assert [i["name"] for i in running.config["islands"]] == ["east-a", "east-b", "west-a"]
    assert enqueued == [] and "east-c" not in store(running).epochs()
    add_island(running, {"name": "west-b", "region": "us-west"}, operator)  # room there
