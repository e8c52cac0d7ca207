"""The run services against a real Redis (the tests' own) and the real database.

Island tasks are recorded instead of sent (the `enqueued` fixture): what a region's
worker then does with one is the supervisor's business (tests/trainer).
"""

import json
import time

import pytest
import redis

from diloco.config import ConfigError
from syncd.store import PoolStore, RunStore, connect
from webapp.runs.failures import record_island_failure
from webapp.runs.faults import (
    inject_fault,
    kill_island,
    kill_region,
    kill_syncd,
)
from webapp.runs.models import Checkpoint, Event, Island, Run
from webapp.runs.services import (
    add_island,
    checkpoint_now,
    create_run,
    island_log,
    pause_run,
    rejoin_island,
    remove_island,
    resume_after_restart,
    resume_run,
    start_run,
    stop_run,
)
from webapp.runs.tasks import run_island

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

THREE_ISLANDS = {
    "sync": {"min_quorum": 2},
    "islands": [
        {"name": "east-a", "region": "us-east"},
        {"name": "east-b", "region": "us-east"},
        {"name": "west-a", "region": "us-west"},
    ],
}


@pytest.fixture
def store(redis_url):
    def for_run(run: Run) -> RunStore:
        return RunStore(connect(redis_url), run.pk)

    return for_run


@pytest.fixture
def running(redis_url, enqueued, operator) -> Run:
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)
    start_run(run, operator)
    enqueued.clear()
    return run


def commands(store: RunStore, island: str) -> list[dict]:
    out = []
    while (command := store.next_command(island)) is not None:
        out.append(command)
    return out


def test_start_run_publishes_the_spec_and_enqueues_each_island_on_its_region(
        redis_url, store, enqueued, operator):
    run = create_run(name="r", mode="elastic", config=THREE_ISLANDS, user=operator)

    start_run(run, operator)

    s = store(run)
    assert s.spec() == {"mode": "elastic", "config": run.config, "secret": run.secret}
    assert str(run.pk) in RunStore.active_runs(s.r)
    assert s.epochs() == {"east-a": 1, "east-b": 1, "west-a": 1}
    assert set(run.islands.values_list("epoch", flat=True)) == {1}
    assert enqueued == [
        {"args": [run.pk, "east-a", 1, redis_url], "queue": "region.us-east"},
        {"args": [run.pk, "east-b", 1, redis_url], "queue": "region.us-east"},
        {"args": [run.pk, "west-a", 1, redis_url], "queue": "region.us-west"},
    ]
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


def test_kill_island_sends_a_kill_for_its_epoch_and_records_who_asked(running, store,
                                                                       operator):
    kill_island(running, "west-a", operator)

    assert commands(store(running), "west-a") == [{"kind": "kill", "epoch": 1}]
    assert commands(store(running), "east-a") == []
    event = Event.objects.get(run=running, kind=Event.Kind.FAULT)
    assert (event.island.name, event.actor, event.detail["fault"]) == ("west-a", operator,
                                                                       "kill")


def test_kill_region_kills_every_island_of_the_region(running, store, operator):
    killed = kill_region(running, "us-east", operator)

    assert [i.name for i in killed] == ["east-a", "east-b"]
    s = store(running)
    # A dark region tells no one: the supervisors hold the deaths back.
    assert commands(s, "east-a") == commands(s, "east-b") == [
        {"kind": "kill", "epoch": 1, "report": False}]
    assert commands(s, "west-a") == []
    assert Event.objects.filter(run=running, kind=Event.Kind.FAULT, actor=operator,
                                detail__region="us-east").count() == 2


def test_kill_region_names_the_regions_the_run_has(running, operator):
    with pytest.raises(ValueError, match=r"no island in region 'eu-west' \(its regions: "
                                         r"us-east, us-west\)"):
        kill_region(running, "eu-west", operator)


def test_inject_fault_sets_the_islands_fault_key_for_a_while(running, store, operator):
    before = time.time()

    inject_fault(running, "east-b", "straggle", 30, 3.0, operator)

    s = store(running)
    fault = json.loads(s.r.get(s.key("fault", "east-b")))
    assert (fault["kind"], fault["factor"]) == ("straggle", 3.0)
    assert before + 30 <= fault["until"] <= time.time() + 30
    assert 30 < s.r.ttl(s.key("fault", "east-b")) <= 90
    event = Event.objects.get(run=running, kind=Event.Kind.FAULT)
    assert (event.island.name, event.actor) == ("east-b", operator)
    assert (event.detail["fault"], event.detail["seconds"], event.detail["factor"]) == (
        "straggle", 30, 3.0)


@pytest.mark.parametrize("kind, factor", [("partition", 1.0), ("degrade", 10.0),
                                          ("corrupt", 1.0)])
def test_each_fault_kind_has_a_default_factor(running, store, kind, factor):
    inject_fault(running, "east-a", kind, 5)

    s = store(running)
    assert json.loads(s.r.get(s.key("fault", "east-a")))["factor"] == factor


@pytest.mark.parametrize("kind, seconds, factor, message", [
    ("meteor", 10, None, "fault kind must be one of straggle, partition, degrade, corrupt, "
                         "got 'meteor'"),
    ("kill", 10, None, "fault kind must be one of"),
    ("straggle", 0, None, "seconds must be more than 0 and at most 86400, got 0"),
    ("straggle", float("inf"), None, "seconds must be"),
    ("straggle", "10", None, "seconds must be"),
    ("straggle", 10, 0.5, r"factor of straggle must be between 1 and 1e6 \(each inner step "
                          r"takes factor times as long\), got 0.5"),
    ("degrade", 10, float("nan"), "factor must be a finite number"),
    ("degrade", 10, 0.1, "factor of degrade must be between 1 and 1e6"),
])
def test_a_bad_fault_is_refused_and_changes_nothing(running, store, kind, seconds, factor,
                                                    message):
    with pytest.raises(ValueError, match=message):
        inject_fault(running, "east-a", kind, seconds, factor)

    s = store(running)
    assert s.r.get(s.key("fault", "east-a")) is None
    assert not Event.objects.filter(kind=Event.Kind.FAULT).exists()


def test_faults_need_an_island_the_run_has(running):
    with pytest.raises(ValueError, match=r"no island named 'nope' \(it has east-a, east-b, "
                                         r"west-a\)"):
        inject_fault(running, "nope", "partition", 10)


def test_faults_need_a_running_run(running, operator):
    stop_run(running, operator)

    with pytest.raises(ValueError, match="cannot inject a fault: the run is stopping"):
        inject_fault(running, "east-a", "partition", 10)
    with pytest.raises(ValueError, match="cannot kill an island: the run is stopping"):
        kill_island(running, "east-a", operator)


def test_a_rejoin_claims_a_warm_standby_when_the_regions_pool_has_one_ready(
        running, store, enqueued, redis_url, operator):
    pools = PoolStore(connect(redis_url))
    pools.put_host("us-west", "host-1", {"ready": 1, "size": 1, "time": time.time()})

    before = time.time()
    rejoin_island(running, "west-a", operator)

    assert enqueued == []  # never behind the busy tasks of the region's queue
    (claim,) = pools.take_claims("us-west", 0.1)
    assert (claim["run"], claim["island"], claim["epoch"]) == (running.pk, "west-a", 2)
    assert before <= claim["asked_at"] <= time.time()


def test_with_the_pool_empty_or_its_host_silent_a_rejoin_is_a_cold_start(
        running, enqueued, redis_url, operator):
    pools = PoolStore(connect(redis_url))
    pools.put_host("us-west", "empty", {"ready": 0, "size": 1, "time": time.time()})
    pools.put_host("us-west", "gone", {"ready": 1, "size": 1, "time": time.time() - 60})

    rejoin_island(running, "west-a", operator)

    assert [task["queue"] for task in enqueued] == ["region.us-west"]
    assert pools.take_claims("us-west", 0.1) == []


def test_rejoin_stops_the_old_epoch_and_enqueues_the_next_epoch(running, store,
                                                                      enqueued, redis_url,
                                                                      operator):
    island = rejoin_island(running, "west-a", operator)

    s = store(running)
    assert island.epoch == 2
    assert Island.objects.get(run=running, name="west-a").epoch == 2
    assert s.epochs()["west-a"] == 2
    assert commands(s, "west-a") == [{"kind": "stop", "epoch": 1}]
    assert enqueued == [{"args": [running.pk, "west-a", 2, redis_url],
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
    assert str(running.pk) in RunStore.active_runs(s.r)
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
    assert enqueued == [{"args": [running.pk, "west-b", 1, redis_url],
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


def test_the_island_task_does_not_start_an_island_of_an_inactive_run(running, redis_url,
                                                                      operator):
    stop_run(running, operator)

    result = run_island(running.pk, "east-a", 1, redis_url)

    assert result == {"island": "east-a", "epoch": 1, "exit_code": None, "ended": "inactive"}


def test_the_island_task_does_not_start_a_superseded_epoch(running, redis_url,
                                                                  settings, tmp_path,
                                                                  operator):
    settings.LOG_DIR = tmp_path
    rejoin_island(running, "east-a", operator)

    result = run_island(running.pk, "east-a", 1, redis_url)

    assert result == {"island": "east-a", "epoch": 1, "exit_code": None,
                      "ended": "superseded"}
    assert "not started: a newer epoch took over" in island_log(running, "east-a")[-1]


def test_checkpoint_now_asks_syncd_and_records_who_asked(running, store, operator):
    checkpoint_now(running, operator)
    assert store(running).take_checkpoint_request() is True
    assert Event.objects.filter(run=running, kind="checkpoint", actor=operator).exists()


def test_only_an_admin_may_kill_syncd(running, operator, django_user_model, redis_url):
    with pytest.raises(PermissionError):
        kill_syncd(operator)
    admin = django_user_model.objects.create_superuser("root", password=None)
    kill_syncd(admin)
    assert connect(redis_url).lpop("arch:syncd:control") == b"kill"
    assert Event.objects.filter(run=running, kind="fault", actor=admin,
                                detail__fault="kill_syncd").exists()


def test_a_crashed_island_leaves_an_alert_saying_why(running):
    record_island_failure(running.pk, "east-a", {"epoch": 1, "exit_code": 1,
                                                 "log_tail": ["Traceback ...", "OSError: disk"]})
    alert = Event.objects.get(run=running, kind="alert")
    assert alert.island.name == "east-a"
    assert "exit code 1" in alert.detail["message"]
    assert alert.detail["log"][-1] == "OSError: disk"
