"""How syncd recovers a run (syncd/recovery.py, with syncd/liveness.py) against a real
Redis and the real database, driven tick by tick: the elastic baseline's whole-job
restarts on loss and on return, the barrier and its waits, and step times behind it;
checkpoints, and the fall-back to one when Redis lost the run's state."""

import json
import math
import time
from pathlib import Path

import pytest
import torch

from syncd import checkpoint
from syncd.connection import connect
from syncd.service import RunSync
from syncd.store import RunStore
from tests.syncd.runs import CONFIG, beat_at, heartbeat_all, make_run_sync, send
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Event
from webapp.runs.records import DatabaseRecorder

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_elastic_rolls_back_to_the_last_outer_step_and_pauses_every_island_on_a_loss(
        redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0)
    beat_at(sync, "b", 1000.0)
    for p in (0, 1):  # outer step 1: both fragments merged by both islands
        send(sync, "a", p, 4)
        send(sync, "b", p, 4)
    sync.tick()
    assert sync.rounds.sync.versions() == [1, 1]
    checkpointed = {n: t.clone() for n, t in sync.rounds.sync.globals[0].items()}
    send(sync, "a", 0, 8, base_version=1)
    send(sync, "b", 0, 8, base_version=1)
    send(sync, "a", 1, 8, base_version=1)  # fragment 1 waits at the barrier for b
    sync.tick()
    assert sync.rounds.sync.versions() == [2, 1]

    sync.clock_state["now"] = 1060.0  # b falls silent past the timeout
    beat_at(sync, "a", 1060.0)
    sync.tick()

    assert sync.liveness.lost == {"b"}
    assert sync.rounds.sync.versions() == [3, 2]  # the rollback is published as newer versions
    assert all(torch.equal(checkpointed[n], t) for n, t in sync.rounds.sync.globals[0].items())
    assert sync.rounds.sync.open_round(1) == {}  # the half-done barrier is thrown away
    generation, until = sync.store.control.restart()
    assert generation == 1 and until == pytest.approx(1060.0 + 5.0)
    sync.recorder.flush()
    rollback = Event.objects.get(run_id=sync.recorder.run_id, kind="rollback")
    assert rollback.detail["versions"] == [3, 2]
    assert rollback.detail["discarded"] == ["a"]


def lose_b_in_elastic(redis_url, tmp_path) -> RunSync:
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0)
    beat_at(sync, "b", 1000.0)
    sync.tick()
    sync.clock_state["now"] = 1060.0
    beat_at(sync, "a", 1060.0)
    sync.tick()
    assert sync.store.control.restart() == (1, pytest.approx(1065.0))
    return sync


def test_elastic_restarts_the_whole_job_again_when_a_lost_island_comes_back(
        redis_url, tmp_path):
    sync = lose_b_in_elastic(redis_url, tmp_path)
    sync.clock_state["now"] = 1070.0
    beat_at(sync, "a", 1070.0)
    sync.store.set_epoch("b", 2)
    beat_at(sync, "b", 1070.0, epoch=2, state="starting")  # b's new epoch arrives
    sync.tick()

    assert sync.liveness.lost == set()
    assert sync.store.control.restart() == (2, pytest.approx(1075.0))
    lost = sync.accounting.snapshot(1070.0)["islands"]
    assert lost["a"]["lost_s"]["restart_pause"] == pytest.approx(10.0)  # out, then in
    assert lost["b"]["lost_s"]["restart_pause"] == 0.0  # its start-up overlaps the pause
    sync.recorder.flush()
    reasons = list(Event.objects.filter(run_id=sync.recorder.run_id, kind="rollback")
                   .values_list("detail__reason", flat=True))
    assert reasons == ["island lost", "island joined"]


def test_elastic_lets_an_island_that_comes_back_during_a_restart_join_that_restart(
        redis_url, tmp_path):
    sync = lose_b_in_elastic(redis_url, tmp_path)
    sync.clock_state["now"] = 1062.0  # the pause runs until 1065
    beat_at(sync, "a", 1062.0)
    sync.store.set_epoch("b", 2)
    beat_at(sync, "b", 1062.0, epoch=2, state="starting")
    sync.tick()

    assert sync.liveness.lost == set()
    assert sync.store.control.restart() == (1, pytest.approx(1065.0))


def test_the_elastic_restart_delay_is_the_slowest_first_start_up_of_the_job(
        redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0, startup_s=3.0)
    sync.tick()
    # b has not reported: the median so far
    assert sync.recovery.restart_delay(sync.liveness.heartbeats) == 3.0
    beat_at(sync, "b", 1000.0, startup_s=7.0)
    sync.tick()
    assert sync.recovery.restart_delay(sync.liveness.heartbeats) == 7.0
    beat_at(sync, "b", 1001.0, epoch=2, startup_s=2.0)  # a rejoin starts alone, faster
    sync.tick()
    assert sync.recovery.restart_delay(sync.liveness.heartbeats) == 7.0


def test_elastic_counts_each_islands_wait_at_the_barrier_when_the_round_merges(
        redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0)
    beat_at(sync, "b", 1000.0)
    send(sync, "a", 0, 4)
    sync.tick()
    assert sync.rounds.sync.versions() == [0, 0]  # the barrier waits for b
    sync.clock_state["now"] = 1003.0
    beat_at(sync, "a", 1003.0)
    beat_at(sync, "b", 1003.0)
    send(sync, "b", 0, 4)
    sync.tick()

    assert sync.rounds.sync.versions() == [1, 0]
    waits = {name: island["lost_s"]["barrier_wait"]
             for name, island in sync.accounting.snapshot(1003.0)["islands"].items()}
    assert waits == {"a": pytest.approx(3.0), "b": 0.0}


@pytest.mark.parametrize("mode, a_has_a_step_time", [("decoupled", True), ("elastic", False)])
def test_another_islands_fault_spoils_step_times_only_behind_a_barrier(
        redis_url, tmp_path, mode, a_has_a_step_time):
    sync = make_run_sync(redis_url, tmp_path, mode)
    sync.store.client.set(sync.store.key("fault", "b"),
                     json.dumps({"kind": "straggle", "until": time.time() + 600}))
    for round_, now in enumerate((1000.0, 1004.0)):
        sync.clock_state["now"] = now
        beat_at(sync, "a", now)
        beat_at(sync, "b", now)
        send(sync, "a", 0, 4 * (round_ + 1), base_version=round_)
        send(sync, "b", 0, 4 * (round_ + 1), base_version=round_)
        sync.tick()

    assert sync.rounds.sync.version(0) == 2
    assert bool(sync.accounting.islands["a"].step_times) is a_has_a_step_time
    assert not sync.accounting.islands["b"].step_times  # its own fault


def test_elastic_does_not_wait_at_the_barrier_for_an_update_it_refused(redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0)
    beat_at(sync, "b", 1000.0)
    send(sync, "a", 0, 4, value=math.nan)
    sync.tick()
    assert "a" not in sync.store.globals.handled(0)  # refused, a waits for the round like b
    send(sync, "b", 0, 4)
    sync.tick()

    assert sync.rounds.sync.versions() == [1, 0]
    assert sync.store.globals.handled(0) == {"a": 4, "b": 4}  # both told with the merge
    assert sync.rounds.publisher.last_merge[0]["weights"].keys() == {"b"}
    send(sync, "a", 0, 8, base_version=0)  # the next round waits for both again
    sync.tick()
    assert sync.rounds.sync.versions() == [1, 0]


def test_elastic_makes_one_restart_of_islands_lost_together(redis_url, tmp_path):
    config = {**CONFIG, "islands": [*CONFIG["islands"],
                                    {"name": "c", "region": "us-east", "batch_size": 2}]}
    run = create_run(name="three", mode="elastic", config=config, user=None)
    store = RunStore(connect(redis_url), run.pk)
    store.put_spec(run.mode, run.config, run.secret)
    clock = {"now": 1000.0}
    sync = RunSync(store, DatabaseRecorder(run.pk), tmp_path, clock=lambda: clock["now"],
                   control_every_s=0.0)
    for island in ("a", "b", "c"):
        store.set_epoch(island, 1)
        beat_at(sync, island, 1000.0)
    sync.tick()
    clock["now"] = 1060.0  # a region outage: b and c fall silent together
    beat_at(sync, "a", 1060.0)
    sync.tick()

    assert sync.liveness.lost == {"b", "c"}
    assert sync.store.control.restart()[0] == 1


def test_elastic_throws_away_an_update_sent_before_a_restart_and_read_after_it(
        redis_url, tmp_path):
    sync = lose_b_in_elastic(redis_url, tmp_path)  # the restart publishes versions 1, 1
    assert sync.rounds.ingester.restart_versions == [1, 1]
    send(sync, "a", 0, 4, base_version=0)  # still in flight when the job restarted
    sync.tick()

    # a's first update after the restart fills its place
    assert sync.rounds.sync.open_round(0) == {}
    assert sync.rounds.sync.handled_seq(0, "a") == 4
    assert sync.rounds.ingester.excused[0] == set()



def test_an_elastic_rollback_restores_the_outer_momentum_of_the_restore_point(
        redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0)
    beat_at(sync, "b", 1000.0)
    for p in (0, 1):  # outer step 1: the restore point
        send(sync, "a", p, 4)
        send(sync, "b", p, 4)
    sync.tick()
    restored = {k: v.clone() for k, v in sync.rounds.sync.optimizers[0].state_dict().items()}
    assert restored
    # Fragment 0 merges again (outer step 2 is not done: fragment 1 waits for b); its
    # outer step moves the momentum buffers on in place.
    send(sync, "a", 0, 8, base_version=1, value=0.05)
    send(sync, "b", 0, 8, base_version=1, value=0.05)
    sync.tick()
    assert sync.rounds.sync.versions() == [2, 1]
    moved = sync.rounds.sync.optimizers[0].state_dict()
    assert any(not torch.equal(moved[k], v) for k, v in restored.items())

    sync.clock_state["now"] = 1060.0  # b falls silent: the job restarts from step 1
    beat_at(sync, "a", 1060.0)
    sync.tick()

    assert sync.liveness.lost == {"b"}
    back = sync.rounds.sync.optimizers[0].state_dict()
    assert back.keys() == restored.keys()
    assert all(torch.equal(back[k], v) for k, v in restored.items())


def test_when_redis_loses_its_data_the_run_goes_on_from_its_last_checkpoint(run_sync, tmp_path):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    run_sync.recovery.save_checkpoint(run_sync.rounds, run_sync.eval_loss)
    run_sync.recorder.flush()
    saved = {n: t.clone() for n, t in run_sync.rounds.sync.globals[0].items()}
    store = run_sync.store
    spec, secret = store.spec(), store.secret()
    store.client.flushall()  # the data is really gone
    store.put_spec(spec["mode"], spec["config"], secret.hex())

    again = RunSync(store, DatabaseRecorder(run_sync.recorder.run_id), tmp_path,
                    clock=lambda: 2000.0)
    again.recorder.flush()

    assert store.globals.versions() == {0: 2, 1: 1}  # newer than the checkpoint's [1, 0]
    assert all(torch.equal(saved[n], t) for n, t in again.rounds.sync.globals[0].items())
    rollback = Event.objects.get(run_id=run_sync.recorder.run_id, kind="rollback")
    assert rollback.detail["reason"] == "Redis lost the run's state"


def test_a_checkpoint_asked_for_is_written_at_the_next_pass(run_sync):
    run_sync.store.control.request_checkpoint()
    run_sync.tick()
    run_sync.recorder.flush()
    checkpoints = run_sync.recorder.checkpoints()
    assert len(checkpoints) == 1
    path, sha256 = checkpoints[0]
    params, _, versions, _ = checkpoint.load(Path(path), sha256)
    assert versions == [0, 0]
    assert set(params) == set(run_sync.rounds.sync.global_params())
    run_sync.tick()
    assert len(run_sync.recorder.checkpoints()) == 1  # asked once, written once


def test_a_barrier_wait_is_lost_once_and_left_out_of_the_step_time(redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    clock = sync.clock_state

    def update(island: str, now: float, seq: int, version: int) -> None:
        clock["now"] = now
        beat_at(sync, island, now)
        send(sync, island, 0, seq, base_version=version)
        sync.tick()

    # a's update of fragment 0 waits 2 s at the barrier for b's, then a trains its next
    # 4 steps in 1 s: 3 s on the clock, of which 2 s are booked as barrier wait.
    beat_at(sync, "b", 1000.0)
    update("a", 1000.0, 4, 0)
    update("b", 1002.0, 4, 0)
    assert sync.rounds.sync.version(0) == 1
    update("a", 1003.0, 8, 1)

    assert sync.accounting.islands["a"].lost["barrier_wait"] == pytest.approx(2.0)
    assert sync.accounting.step_time("a") == pytest.approx(0.25)
