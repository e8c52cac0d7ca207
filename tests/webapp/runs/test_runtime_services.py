"""The run services against a real Redis (the tests' own) and the real database.

Island tasks are recorded instead of sent (the `enqueued` fixture): what a region's
worker then does with one is the supervisor's business (tests/trainer).
"""

import json
import time

import pytest
import redis

from diloco.config_parse import ConfigError
from diloco.signing import island_key, verify_key_hex
from syncd.connection import connect
from syncd.pool_store import PoolStore
from syncd.store import RunStore
from tests.webapp.runs.three_islands import THREE_ISLANDS, commands
from trainer.claims import claim_signed, claims_key
from webapp.runs.faults import kill_island
from webapp.runs.lifecycle import (
    checkpoint_now,
    create_run,
    pause_run,
    resume_run,
    start_run,
    stop_run,
)
from webapp.runs.membership import add_island, rejoin_island, remove_island
from webapp.runs.models import Checkpoint, Event, Island, Run
from webapp.runs.reports import island_log
from webapp.runs.restart import resume_after_restart

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


def test_stop_run_stops_every_island_and_leaves_the_run_to_syncd_to_finish(
        running, store, operator):
    stop_run(running, operator)

    s = store(running)
    for name in ("east-a", "east-b", "west-a"):
        assert commands(s, name) == [{"kind": "stop", "epoch": 1}]
    # syncd merges what arrives, checkpoints, frees the keys and makes it stopped.
    assert str(running.pk) in RunStore.active_runs(s.client)
    assert s.stop_requested() is not None
    running.refresh_from_db()
    assert running.state == Run.State.STOPPING and running.finished_at is None


def test_a_pause_asks_for_a_checkpoint_unless_one_is_newer_than_a_minute(
        running, store, operator):
    pause_run(running, operator)
    assert store(running).take_checkpoint_request()
    resume_run(running, operator)
    Checkpoint.objects.create(run=running, versions={}, outer_step=0, path="x", sha256="0",
                              bytes=1)

    pause_run(running, operator)
    assert not store(running).take_checkpoint_request()


def test_pause_and_resume_freeze_and_thaw_every_island(running, store, operator):
    pause_run(running, operator)
    s = store(running)
    assert commands(s, "east-a") == [{"kind": "pause", "epoch": 1}]
    assert running.state == Run.State.PAUSED

    resume_run(running, operator)
    assert commands(s, "east-a") == [{"kind": "resume", "epoch": 1}]
    assert running.state == Run.State.RUNNING


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


def test_resume_after_restart_runs_every_alive_island_again_with_its_next_epoch(
        running, store, enqueued, operator):
    paused = create_run(name="p", mode="decoupled", config=THREE_ISLANDS, user=operator)
    start_run(paused, operator)
    pause_run(paused, operator)
    done = create_run(name="d", mode="decoupled", config=THREE_ISLANDS, user=operator)
    start_run(done, operator)
    stop_run(done, operator)
    for run in (running, paused):
        commands(store(run), "east-a")
    enqueued.clear()

    resumed = resume_after_restart()

    assert [r.pk for r in resumed] == [running.pk, paused.pk]
    assert [(call["args"][0], call["args"][2]) for call in enqueued] == (
        [(running.pk, 2)] * 3 + [(paused.pk, 2)] * 3)
    assert store(running).epochs() == {"east-a": 2, "east-b": 2, "west-a": 2}
    # A paused run stays paused: its new island processes freeze as they start.
    assert commands(store(paused), "east-a") == [{"kind": "pause", "epoch": 2}]
    assert commands(store(running), "east-a") == []


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
    store(running).put_log("east-a", ["step 1", "step 2", "step 3"])

    assert island_log(running, "east-a", lines=2) == ["step 2", "step 3"]


def test_checkpoint_now_asks_syncd_and_records_who_asked(running, store, operator):
    checkpoint_now(running, operator)
    assert store(running).take_checkpoint_request() is True
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
