"""syncd's RunSync against a real Redis and the real database, driven tick by tick.

Updates are written into the run's stream exactly as an island would write
them (or as an attacker could), and each tick is one pass of the live loop.
"""

import json
import math
import time
from pathlib import Path

import pytest
import torch

from syncd import checkpoint, recovery
from syncd.protocol import encode_message
from syncd.records import Recorder
from syncd.service import RunSync
from syncd.store import RunStore, connect
from trainer import compress
from webapp.runs.models import Event
from webapp.runs.services import create_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

CONFIG = {
    "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
    "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2,
             "max_staleness": 1},
    "eval": {"tokens": 256},
    "budget": {"total_tokens": 10**9},
    "islands": [{"name": "a", "region": "us-east", "batch_size": 2},
                {"name": "b", "region": "us-east", "batch_size": 2}],
}
TOKENS_PER_STEP = 2 * 16


def make_run_sync(redis_url: str, tmp_path, mode: str) -> RunSync:
    run = create_run(name="syncd test", mode=mode, config=CONFIG, user=None)
    store = RunStore(connect(redis_url), run.pk)
    store.put_spec(run.mode, run.config, run.secret)
    store.set_epoch("a", 1)
    store.set_epoch("b", 1)
    clock = {"now": 1000.0}
    # Every tick reads everything: the tests step a frozen clock.
    sync = RunSync(store, Recorder(run.pk), tmp_path, clock=lambda: clock["now"],
                   control_every_s=0.0)
    sync.clock_state = clock
    return sync


@pytest.fixture
def run_sync(redis_url, tmp_path):
    return make_run_sync(redis_url, tmp_path, "decoupled")


def send(sync: RunSync, island: str, fragment: int, seq: int, *, epoch: int = 1,
         base_version: int = 0, steps: int = 4, value: float = 0.01, codec: str = "none",
         secret: bytes | None = None, shapes: dict | None = None, tokens: int | None = None
         ) -> None:
    shapes = shapes or sync.sync.shapes[fragment]
    delta = {n: torch.full(s, value) for n, s in shapes.items()}
    meta = {"run": sync.store.run_id, "island": island, "epoch": epoch, "fragment": fragment,
            "base_version": base_version, "seq": seq,
            "tokens": steps * TOKENS_PER_STEP if tokens is None else tokens,
            "inner_steps": steps, "compute_s": 1.0, "codec": codec}
    blob = encode_message("update", meta, compress.encode(delta, codec), secret or sync.secret)
    sync.store.push_update(island, epoch, fragment, seq, blob)


def heartbeat_all(sync: RunSync) -> None:
    for island in ("a", "b"):
        sync.store.heartbeat(island, 1, 4, 128, state="training")


def rejections(sync: RunSync) -> list[str]:
    sync.recorder.flush()
    return [e.detail["reason"] for e in Event.objects.filter(run_id=sync.recorder.run_id,
                                                             kind="rejection")]


def test_it_publishes_version_zero_of_every_fragment_when_a_run_starts(run_sync):
    assert run_sync.store.versions() == {0: 0, 1: 0}


def test_two_good_updates_merge_into_version_one(run_sync):
    heartbeat_all(run_sync)
    before = {n: t.clone() for n, t in run_sync.sync.globals[0].items()}
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    assert run_sync.store.versions()[0] == 1
    assert run_sync.store.handled(0) == {"a": 4, "b": 4}
    moved = any(not torch.equal(before[n], t) for n, t in run_sync.sync.globals[0].items())
    assert moved


@pytest.mark.parametrize("bad, reason", [
    ({"secret": b"another run's secret"}, "bad signature"),
    ({"value": math.nan}, "non-finite"),
    ({"epoch": 0}, "old epoch"),
    ({"tokens": 7}, "do not match"),
    ({"shapes": {"nonsense.weight": (3, 3)}}, "do not match the fragment"),
])
def test_it_rejects_a_bad_update_with_a_reason_and_never_merges_it(run_sync, bad, reason):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4, **bad)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    assert any(reason in r for r in rejections(run_sync)), rejections(run_sync)
    # Only b's update is waiting; a bad one never counts towards the quorum.
    assert run_sync.store.versions()[0] == 0
    assert list(run_sync.sync.rounds[0]) == ["b"]


def test_a_replayed_update_is_merged_at_most_once(run_sync):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    send(run_sync, "a", 0, 4)  # the same seq again
    send(run_sync, "b", 0, 8)
    run_sync.tick()
    assert run_sync.store.versions()[0] == 1
    assert list(run_sync.sync.rounds[0]) == ["b"]


def test_an_update_based_on_a_version_too_old_is_dropped_as_stale(run_sync):
    heartbeat_all(run_sync)
    for seq in (4, 8):
        send(run_sync, "a", 0, seq, base_version=seq // 4 - 1)
        send(run_sync, "b", 0, seq, base_version=seq // 4 - 1)
        run_sync.tick()
    assert run_sync.store.versions()[0] == 2
    send(run_sync, "a", 0, 12, base_version=0)
    run_sync.tick()
    assert any("stale" in r for r in rejections(run_sync))
    assert "a" not in run_sync.sync.rounds[0]


def test_a_restarted_syncd_goes_on_from_what_redis_holds(run_sync, tmp_path):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    send(run_sync, "a", 1, 4)  # waiting in fragment 1's round when syncd dies
    run_sync.tick()
    merged = {n: t.clone() for n, t in run_sync.sync.globals[0].items()}

    again = RunSync(run_sync.store, Recorder(run_sync.recorder.run_id), tmp_path,
                    clock=lambda: 1000.0, control_every_s=0.0)
    again.tick()
    assert again.sync.versions == [1, 0]
    assert all(torch.equal(merged[n], t) for n, t in again.sync.globals[0].items())
    assert list(again.sync.rounds[1]) == ["a"]  # read again from the stream
    assert list(again.sync.rounds[0]) == []  # merged ones are not merged twice


def beat_at(sync: RunSync, island: str, time: float, *, epoch: int = 1,
            state: str = "training", startup_s: float | None = None) -> None:
    beat = {"epoch": epoch, "time": time, "step": 4, "tokens": 128, "state": state,
            "startup_s": startup_s}
    sync.store.r.hset(sync.store.key("heartbeats"), island, json.dumps(beat))


def test_an_island_silent_past_the_timeout_is_lost_and_revived_when_it_speaks(run_sync):
    beat_at(run_sync, "a", 1000.0)
    beat_at(run_sync, "b", 1000.0)
    run_sync.tick()
    run_sync.clock_state["now"] = 1000.0 + 60  # past the 10 s heartbeat timeout
    beat_at(run_sync, "b", 1060.0)
    run_sync.tick()
    assert run_sync.lost == {"a"}
    beat_at(run_sync, "a", 1060.0)
    run_sync.tick()
    assert run_sync.lost == set()
    run_sync.recorder.flush()
    kinds = list(Event.objects.filter(run_id=run_sync.recorder.run_id)
                 .values_list("kind", flat=True))
    assert kinds.count("island_lost") == 1
    assert kinds.count("island_revived") == 1


def test_elastic_rolls_back_to_the_last_outer_step_and_pauses_every_island_on_a_loss(
        redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0)
    beat_at(sync, "b", 1000.0)
    for p in (0, 1):  # outer step 1: both fragments merged by both islands
        send(sync, "a", p, 4)
        send(sync, "b", p, 4)
    sync.tick()
    assert sync.sync.versions == [1, 1]
    checkpointed = {n: t.clone() for n, t in sync.sync.globals[0].items()}
    send(sync, "a", 0, 8, base_version=1)
    send(sync, "b", 0, 8, base_version=1)
    send(sync, "a", 1, 8, base_version=1)  # fragment 1 waits at the barrier for b
    sync.tick()
    assert sync.sync.versions == [2, 1]

    sync.clock_state["now"] = 1060.0  # b falls silent past the timeout
    beat_at(sync, "a", 1060.0)
    sync.tick()

    assert sync.lost == {"b"}
    assert sync.sync.versions == [3, 2]  # the rollback is published as newer versions
    assert all(torch.equal(checkpointed[n], t) for n, t in sync.sync.globals[0].items())
    assert sync.sync.rounds[1] == {}  # the half-done barrier is thrown away
    generation, until = sync.store.restart()
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
    assert sync.store.restart() == (1, pytest.approx(1065.0))
    return sync


def test_elastic_restarts_the_whole_job_again_when_a_lost_island_comes_back(
        redis_url, tmp_path):
    sync = lose_b_in_elastic(redis_url, tmp_path)
    sync.clock_state["now"] = 1070.0
    beat_at(sync, "a", 1070.0)
    sync.store.set_epoch("b", 2)
    beat_at(sync, "b", 1070.0, epoch=2, state="starting")  # b's new incarnation arrives
    sync.tick()

    assert sync.lost == set()
    assert sync.store.restart() == (2, pytest.approx(1075.0))
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

    assert sync.lost == set()
    assert sync.store.restart() == (1, pytest.approx(1065.0))


def test_the_elastic_restart_delay_is_the_slowest_first_start_up_of_the_job(
        redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0, startup_s=3.0)
    sync.tick()
    assert recovery.restart_delay(sync) == 3.0  # b has not reported: the median so far
    beat_at(sync, "b", 1000.0, startup_s=7.0)
    sync.tick()
    assert recovery.restart_delay(sync) == 7.0
    beat_at(sync, "b", 1001.0, epoch=2, startup_s=2.0)  # a rejoin starts alone, faster
    sync.tick()
    assert recovery.restart_delay(sync) == 7.0


def test_the_status_carries_goodput_once_step_times_are_known(run_sync):
    for round_, now in enumerate((1000.0, 1004.0, 1008.0)):  # 4 steps in 4 s: 1 s a step
        run_sync.clock_state["now"] = now
        beat_at(run_sync, "a", now)
        beat_at(run_sync, "b", now)
        seq = 4 * (round_ + 1)
        send(run_sync, "a", 0, seq, base_version=round_)
        send(run_sync, "b", 0, seq, base_version=round_)
        run_sync.next_status = 0.0
        run_sync.tick()
    status = run_sync.store.status()
    assert status["versions"] == [3, 0]
    # Fragment 0 of 2 merged 12 steps of each island: 6 steps' worth of 1 s useful,
    # out of the 8 s allocated since syncd took the run on at 1000.
    assert status["goodput"] == pytest.approx(0.75)
    assert status["islands"]["a"]["goodput"] > 0
    assert status["islands"]["a"]["fault"] == "none"


def test_elastic_counts_each_islands_wait_at_the_barrier_when_the_round_merges(
        redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0)
    beat_at(sync, "b", 1000.0)
    send(sync, "a", 0, 4)
    sync.tick()
    assert sync.sync.versions == [0, 0]  # the barrier waits for b
    sync.clock_state["now"] = 1003.0
    beat_at(sync, "a", 1003.0)
    beat_at(sync, "b", 1003.0)
    send(sync, "b", 0, 4)
    sync.tick()

    assert sync.sync.versions == [1, 0]
    waits = {name: island["lost_s"]["barrier_wait"]
             for name, island in sync.accounting.snapshot(1003.0)["islands"].items()}
    assert waits == {"a": pytest.approx(3.0), "b": 0.0}


@pytest.mark.parametrize("mode, a_has_a_step_time", [("decoupled", True), ("elastic", False)])
def test_another_islands_fault_spoils_step_times_only_behind_a_barrier(
        redis_url, tmp_path, mode, a_has_a_step_time):
    sync = make_run_sync(redis_url, tmp_path, mode)
    sync.store.r.set(sync.store.key("fault", "b"),
                     json.dumps({"kind": "straggle", "until": time.time() + 600}))
    for round_, now in enumerate((1000.0, 1004.0)):
        sync.clock_state["now"] = now
        beat_at(sync, "a", now)
        beat_at(sync, "b", now)
        send(sync, "a", 0, 4 * (round_ + 1), base_version=round_)
        send(sync, "b", 0, 4 * (round_ + 1), base_version=round_)
        sync.tick()

    assert sync.sync.versions[0] == 2
    assert bool(sync.accounting.islands["a"].step_times) is a_has_a_step_time
    assert not sync.accounting.islands["b"].step_times  # its own fault


def test_elastic_does_not_wait_at_the_barrier_for_an_update_it_refused(redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "elastic")
    beat_at(sync, "a", 1000.0)
    beat_at(sync, "b", 1000.0)
    send(sync, "a", 0, 4, value=math.nan)
    sync.tick()
    assert "a" not in sync.store.handled(0)  # refused, a waits for the round like b
    send(sync, "b", 0, 4)
    sync.tick()

    assert sync.sync.versions == [1, 0]
    assert sync.store.handled(0) == {"a": 4, "b": 4}  # both told with the merge
    assert sync.last_merge[0]["weights"].keys() == {"b"}
    send(sync, "a", 0, 8, base_version=0)  # the next round waits for both again
    sync.tick()
    assert sync.sync.versions == [1, 0]


def test_elastic_makes_one_restart_of_islands_lost_together(redis_url, tmp_path):
    config = {**CONFIG, "islands": [*CONFIG["islands"],
                                    {"name": "c", "region": "us-east", "batch_size": 2}]}
    run = create_run(name="three", mode="elastic", config=config, user=None)
    store = RunStore(connect(redis_url), run.pk)
    store.put_spec(run.mode, run.config, run.secret)
    clock = {"now": 1000.0}
    sync = RunSync(store, Recorder(run.pk), tmp_path, clock=lambda: clock["now"],
                   control_every_s=0.0)
    for island in ("a", "b", "c"):
        store.set_epoch(island, 1)
        beat_at(sync, island, 1000.0)
    sync.tick()
    clock["now"] = 1060.0  # a region outage: b and c fall silent together
    beat_at(sync, "a", 1060.0)
    sync.tick()

    assert sync.lost == {"b", "c"}
    assert sync.store.restart()[0] == 1


def test_when_redis_loses_its_data_the_run_goes_on_from_its_last_checkpoint(run_sync, tmp_path):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    recovery.save_checkpoint(run_sync)
    run_sync.recorder.flush()
    saved = {n: t.clone() for n, t in run_sync.sync.globals[0].items()}
    store = run_sync.store
    spec = store.spec()
    store.r.flushall()  # the data is really gone
    store.put_spec(spec["mode"], spec["config"], spec["secret"])

    again = RunSync(store, Recorder(run_sync.recorder.run_id), tmp_path, clock=lambda: 2000.0)
    again.recorder.flush()

    assert store.versions() == {0: 2, 1: 1}  # newer than the checkpoint's [1, 0]
    assert all(torch.equal(saved[n], t) for n, t in again.sync.globals[0].items())
    rollback = Event.objects.get(run_id=run_sync.recorder.run_id, kind="rollback")
    assert rollback.detail["reason"] == "Redis lost the run's state"


def test_a_checkpoint_asked_for_is_written_at_the_next_pass(run_sync):
    run_sync.store.request_checkpoint()
    run_sync.tick()
    run_sync.recorder.flush()
    checkpoints = run_sync.recorder.checkpoints()
    assert len(checkpoints) == 1
    path, sha256 = checkpoints[0]
    params, _, versions, _ = checkpoint.load(Path(path), sha256)
    assert versions == [0, 0]
    assert set(params) == set(run_sync.sync.global_params())
    run_sync.tick()
    assert len(run_sync.recorder.checkpoints()) == 1  # asked once, written once


def test_the_status_has_each_islands_tokens_per_second_and_the_train_loss(run_sync):
    for now, tokens, loss in ((1000.0, 0, 3.0), (1002.0, 640, 2.0)):
        run_sync.clock_state["now"] = now
        for island in ("a", "b"):
            beat = {"epoch": 1, "time": now, "step": tokens // 32, "tokens": tokens,
                    "state": "training", "loss": loss + (island == "b")}
            run_sync.store.r.hset(run_sync.store.key("heartbeats"), island, json.dumps(beat))
        run_sync.next_status = 0.0
        run_sync.tick()
    status = run_sync.store.status()
    assert status["islands"]["a"]["tokens_per_s"] == pytest.approx(320.0)
    assert status["train_loss"] == pytest.approx(2.5)  # the median of 2.0 and 3.0
