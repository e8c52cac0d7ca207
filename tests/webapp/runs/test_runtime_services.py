"""The run services against a real Redis (the tests' own) and the real database.

Island tasks are recorded instead of sent (the `enqueued` fixture): what a region's
worker then does with one is the supervisor's business (tests/trainer).
"""

import json
import time

import pytest
import redis

from diloco.signing import island_key, redis_password, verify_key_hex
from syncd.acl import island_url, island_user
from syncd.connection import connect
from syncd.pool_store import PoolStore
from syncd.store import RunStore
from tests.fixtures import redis_users
from tests.webapp.runs.three_islands import THREE_ISLANDS, commands
from webapp.runs.lifecycle import (
    checkpoint_now,
    create_run,
    delete_run,
    pause_run,
    resume_run,
    start_run,
    stop_run,
)
from webapp.runs.models import Checkpoint, Event, Run
from webapp.runs.reports import island_log

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

def test_start_run_publishes_the_spec_and_enqueues_each_island_on_its_region(
        redis_url, store, enqueued, operator):
    run = create_run(name="r", mode="elastic", config=THREE_ISLANDS, user=operator)

    start_run(run, operator)

    s = store(run)
    # What islands read holds no secret: only the public half of syncd's publish key.
    assert s.spec() == {"mode": "elastic", "config": run.config,
                        "verify_key": verify_key_hex(bytes.fromhex(run.secret))}
    assert s.secret() == bytes.fromhex(run.secret)
    assert str(run.pk) in RunStore.active_runs(s.client)
    assert s.epochs() == {"east-a": 1, "east-b": 1, "west-a": 1}
    assert set(run.islands.values_list("epoch", flat=True)) == {1}
    # Each island gets its own epoch's key, never the run's secret.
    secret = bytes.fromhex(run.secret)
    assert enqueued == [
        {"args": [run.pk, "east-a", 1, redis_url, island_key(secret, "east-a", 1).hex()],
         "queue": "region.us-east"},
        {"args": [run.pk, "east-b", 1, redis_url, island_key(secret, "east-b", 1).hex()],
         "queue": "region.us-east"},
        {"args": [run.pk, "west-a", 1, redis_url, island_key(secret, "west-a", 1).hex()],
         "queue": "region.us-west"},
    ]
    assert run.secret not in json.dumps(enqueued)
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING and run.started_at is not None
    assert list(run.events.filter(kind=Event.Kind.RUN_STATE)
                .values_list("detail__to", "actor")) == [("queued", operator.pk),
                                                         ("running", operator.pk)]


def test_a_started_runs_islands_have_a_redis_user_of_their_own_until_it_is_deleted(
        running, store, operator, redis_url):
    s = store(running)
    url = island_url(redis_url, running.pk, redis_password(bytes.fromhex(running.secret)))
    island = RunStore(connect(url), running.pk)
    assert island.is_active() and island.epochs()["east-a"] == 1
    with pytest.raises(redis.exceptions.NoPermissionError):
        island.client.get(s.key("secret"))
    assert not running.events.filter(kind=Event.Kind.ALERT).exists()

    Run.objects.filter(pk=running.pk).update(state=Run.State.STOPPED)
    running.refresh_from_db()
    delete_run(running, operator)

    assert island_user(running.pk) not in redis_users(s.client)


def test_a_redis_that_makes_no_island_user_starts_the_run_and_says_so(
        redis_url, settings, enqueued, operator):
    # A control-plane credential allowed everything but ACL, as a Redis without ACL.
    admin = connect(redis_url)
    admin.execute_command("ACL", "SETUSER", "no-acl", "on", ">pw", "~*", "&*", "+@all",
                          "-acl")
    settings.REDIS_URL = redis_url.replace("redis://", "redis://no-acl:pw@")
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)

    try:
        start_run(run, operator)
    finally:
        admin.execute_command("ACL", "DELUSER", "no-acl")

    run.refresh_from_db()
    assert run.state == Run.State.RUNNING and len(enqueued) == 3
    (alert,) = run.events.filter(kind=Event.Kind.ALERT)
    assert alert.detail["message"].startswith("Redis made no island user")
    assert island_user(run.pk) not in redis_users(admin)


def test_a_run_can_be_started_once(running, enqueued, operator):
    with pytest.raises(ValueError, match="cannot go from running to queued"):
        start_run(running, operator)

    assert enqueued == []


def test_a_run_that_cannot_reach_redis_fails_with_the_reason(settings, enqueued, operator):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)

    with pytest.raises(redis.ConnectionError):
        start_run(run, operator)

    run.refresh_from_db()
    assert run.state == Run.State.FAILED
    assert run.failure_reason.startswith("The run could not be started")
    assert enqueued == []


def test_stop_run_stops_every_island_and_leaves_the_run_to_syncd_to_finish(
        running, store, operator):
    stop_run(running, operator)

    s = store(running)
    for name in ("east-a", "east-b", "west-a"):
        assert commands(s, name) == [{"kind": "stop", "epoch": 1}]
    # syncd merges what arrives, checkpoints, frees the keys and makes it stopped.
    assert str(running.pk) in RunStore.active_runs(s.client)
    assert s.control.stop_requested() is not None
    running.refresh_from_db()
    assert running.state == Run.State.STOPPING and running.finished_at is None


def test_a_pause_asks_for_a_checkpoint_unless_one_is_newer_than_a_minute(
        running, store, operator):
    pause_run(running, operator)
    assert store(running).control.take_checkpoint_request()
    resume_run(running, operator)
    Checkpoint.objects.create(run=running, versions={}, outer_step=0, path="x", sha256="0",
                              bytes=1)

    pause_run(running, operator)
    assert not store(running).control.take_checkpoint_request()


def test_pause_and_resume_freeze_and_thaw_every_island(running, store, operator):
    pause_run(running, operator)
    s = store(running)
    assert commands(s, "east-a") == [{"kind": "pause", "epoch": 1}]
    assert running.state == Run.State.PAUSED

    resume_run(running, operator)
    assert commands(s, "east-a") == [{"kind": "resume", "epoch": 1}]
    assert running.state == Run.State.RUNNING


def test_island_log_reads_the_end_of_the_islands_log(running, settings, tmp_path):
    settings.LOG_DIR = tmp_path
    (tmp_path / f"run-{running.pk}").mkdir()
    (tmp_path / f"run-{running.pk}" / "east-a.log").write_text(
        "step 1\nstep 2\nTraceback (most recent call last):\nValueError: boom\n")

    assert island_log(running, "east-a", lines=2) == [
        "Traceback (most recent call last):", "ValueError: boom"]
    assert island_log(running, "west-a") == []


def test_island_log_prefers_what_the_supervisor_put_in_redis(running, store, settings,
                                                             tmp_path):
    settings.LOG_DIR = tmp_path  # no file here: the island runs on another host
    store(running).signals.put_log("east-a", ["step 1", "step 2", "step 3"])

    assert island_log(running, "east-a", lines=2) == ["step 2", "step 3"]


def test_checkpoint_now_asks_syncd_and_records_who_asked(running, store, operator):
    checkpoint_now(running, operator)
    assert store(running).control.take_checkpoint_request() is True
    assert Event.objects.filter(run=running, kind="checkpoint", actor=operator).exists()


def test_a_start_whose_pool_does_not_fill_in_time_starts_cold_and_says_so(
        redis_url, enqueued, operator, settings):
    settings.ISLAND_POOL_FILL_WAIT_S = 0  # the pool has what it has
    PoolStore(connect(redis_url)).put_host("us-east", "host-1", {
        "ready": 1, "size": 3, "time": time.time()})
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)

    start_run(run, operator)

    (alert,) = Event.objects.filter(run=run, kind="alert")
    # us-west has no pool: its island starts cold as always, not waited for.
    # Two islands and the standby a first rejoin takes.
    assert alert.detail["cold_start"] == {"us-east": {"ready": 1, "wanted": 3, "islands": 2}}
    assert alert.detail["message"] == ("1 island starts cold: after 0 s us-east had 1 of 3 "
                                       "standbys ready")
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING


def test_a_start_with_a_standby_per_island_or_no_pool_says_nothing_of_cold_starts(
        redis_url, enqueued, operator, settings):
    settings.ISLAND_POOL_FILL_WAIT_S = 0
    PoolStore(connect(redis_url)).put_host("us-east", "host-1", {
        "ready": 2, "size": 3, "time": time.time()})  # no spare: still no island is cold
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)

    start_run(run, operator)

    assert not Event.objects.filter(run=run, kind="alert").exists()
    assert [task["queue"] for task in enqueued] == ["region.us-west"]  # us-east claimed
