"""How a run's processes are told what to run (webapp/runs/dispatch.py): the spec in
Redis, and an island epoch's start on a warm standby or its region's queue, against a
real Redis (the tests' own) and the real database. (The services that call these:
tests/webapp/runs/test_runtime_services.py and test_membership.py.)"""

import time

import pytest

from diloco.signing import island_key, redis_password, verify_key_hex
from syncd.acl import delete_island_user, island_store, island_url, island_user
from syncd.connection import connect
from syncd.pool_store import PoolStore
from syncd.store import RunStore
from tests.webapp.runs.three_islands import commands
from webapp.runs.dispatch import claim_standby, enqueue, put_spec, start_next_epoch
from webapp.runs.lifecycle import pause_run
from webapp.runs.models import Island
from webapp.runs.tasks import run_island

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.fixture
def sent(monkeypatch):
    """Island tasks sent, with their keyword arguments."""
    tasks: list[dict] = []
    monkeypatch.setattr(run_island, "apply_async",
                        lambda args=None, kwargs=None, **options: tasks.append(
                            {"args": list(args), "kwargs": kwargs, **options}))
    return tasks


def ready_pool(redis_url, region: str) -> PoolStore:
    pools = PoolStore(connect(redis_url))
    pools.put_host(region, "host-1", {"ready": 1, "size": 1, "time": time.time()})
    return pools


def test_the_spec_is_the_runs_mode_config_and_secret(running, store):
    s = store(running)
    s.client.delete(s.key("spec"))

    put_spec(running, s)

    assert s.spec() == {"mode": running.mode, "config": running.config,
                        "verify_key": verify_key_hex(bytes.fromhex(running.secret))}
    assert s.secret() == bytes.fromhex(running.secret)  # apart, never in the spec


def test_with_no_standby_ready_the_epoch_is_a_task_on_its_regions_queue(running, sent,
                                                                        redis_url):
    island = Island.objects.get(run=running, name="west-a")

    enqueue(running, island, asked_at=123.0)

    key = island_key(bytes.fromhex(running.secret), "west-a", 1).hex()
    password = redis_password(bytes.fromhex(running.secret))
    assert sent == [{"args": [running.pk, "west-a", 1, redis_url, key],
                     "kwargs": {"asked_at": 123.0, "redis_password": password},
                     "queue": "region.us-west"}]


def test_with_a_standby_ready_the_epoch_is_a_claim_on_its_regions_pool(running, sent,
                                                                       redis_url):
    pools = ready_pool(redis_url, "us-west")
    island = Island.objects.get(run=running, name="west-a")

    enqueue(running, island, asked_at=123.0)

    assert sent == []
    ((_, claim),) = pools.take_claims("us-west", "host-1", timeout_s=1)
    key = island_key(bytes.fromhex(running.secret), "west-a", 1).hex()
    fields = ("run", "island", "epoch", "asked_at", "island_key", "redis_password")
    assert {k: claim[k] for k in fields} == {
        "run": running.pk, "island": "west-a", "epoch": 1, "asked_at": 123.0,
        "island_key": key, "redis_password": redis_password(bytes.fromhex(running.secret))}


def test_a_launch_makes_the_runs_island_user_again_when_redis_lost_it(running, sent,
                                                                     redis_url):
    client = connect(redis_url)
    client.execute_command("ACL", "DELUSER", island_user(running.pk))  # a Redis restart

    enqueue(running, Island.objects.get(run=running, name="west-a"), asked_at=0.0)

    url = island_url(redis_url, running.pk, sent[0]["kwargs"]["redis_password"])
    assert RunStore(connect(url), running.pk).is_active()


def test_a_launch_makes_the_runs_island_user_on_the_data_plane_too(running, sent, redis_url,
                                                                   dataplane_url):
    enqueue(running, Island.objects.get(run=running, name="west-a"), asked_at=0.0)

    password = sent[0]["kwargs"]["redis_password"]
    try:
        island = island_store(island_url(redis_url, running.pk, password),
                              island_url(dataplane_url, running.pk, password), running.pk)
        island.updates.push_update("west-a", 1, 0, 4, b"x" * 64)
        assert connect(dataplane_url).exists(island.updates.update_key("west-a", 1, 0, 4) + ":0")
    finally:
        delete_island_user(connect(dataplane_url), running.pk)


def test_an_island_of_several_processes_never_claims_a_standby(running, redis_url):
    ready_pool(redis_url, "us-west")
    island = Island.objects.get(run=running, name="west-a")
    running.config["islands"] = [{**i, "processes": 2} if i["name"] == "west-a" else i
                                 for i in running.config["islands"]]

    assert claim_standby(running, island, asked_at=0.0) is False


def test_the_next_epoch_of_a_paused_run_is_frozen_before_it_starts(running, store, sent,
                                                                   operator):
    pause_run(running, operator)
    s = store(running)
    commands(s, "east-a")

    island = start_next_epoch(running, Island.objects.get(run=running, name="east-a"), s)

    assert island.epoch == Island.objects.get(pk=island.pk).epoch == 2
    assert s.epochs()["east-a"] == 2
    assert commands(s, "east-a") == [{"kind": "pause", "epoch": 2}]
    assert [task["args"][1:3] for task in sent] == [["east-a", 2]]
