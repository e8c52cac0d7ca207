"""What syncd knows of an island from its heartbeat, its supervisor's death report and
its epoch (syncd.liveness.condition), with plain values and a clock of the test's own;
then the watch of a RunSync's islands, lost and revived, against a real Redis and the
real database."""

import time

import pytest

from syncd.liveness import condition
from syncd.pool_store import PoolStore
from syncd.records import Heartbeat
from tests.syncd.runs import beat_at, send, write_beat
from webapp.runs.models import Event

TIMEOUT = 10.0


def beat(epoch=1, at=100.0, state="training"):
    return Heartbeat.bare(epoch, at, 0, 0, state)


def death(epoch=1, at=101.0, exit_code=-9):
    return {"epoch": epoch, "time": at, "exit_code": exit_code, "signal": 9}


def test_a_reported_death_makes_the_island_dead_at_once_whatever_its_heartbeat_says():
    assert condition(beat(at=100.0), death(), 1, 100.5, TIMEOUT) == "dead"


def test_without_a_report_an_island_is_alive_until_its_heartbeat_times_out():
    assert condition(beat(at=100.0), None, 1, 109.9, TIMEOUT) == "alive"
    assert condition(beat(at=100.0), None, 1, 110.1, TIMEOUT) == "silent"


def test_the_death_of_an_older_epoch_says_nothing_of_the_current_one():
    assert condition(beat(epoch=2, at=100.0), death(epoch=1), 2, 100.5, TIMEOUT) == "alive"


def test_a_death_before_the_next_epoch_spoke_no_longer_counts_once_it_is_current():
    # A rejoin set epoch 2; until epoch 2 speaks the island is neither alive nor lost.
    assert condition(beat(epoch=1), death(epoch=1), 2, 100.5, TIMEOUT) == "unknown"


def test_an_epoch_that_died_before_its_first_heartbeat_is_dead():
    assert condition(beat(epoch=1), death(epoch=2), 2, 100.5, TIMEOUT) == "dead"
    assert condition(None, death(epoch=1), 1, 100.5, TIMEOUT) == "dead"


def test_a_stopped_island_is_not_alive_and_not_dead():
    assert condition(beat(state="stopped"), None, 1, 100.5, TIMEOUT) == "stopped"
    assert condition(None, None, 1, 100.5, TIMEOUT) == "unknown"


# -- the watch in a RunSync, against a real Redis and the real database ---------------


@pytest.mark.integration
@pytest.mark.django_db
def test_an_island_silent_past_the_timeout_is_lost_and_revived_when_it_speaks(run_sync):
    beat_at(run_sync, "a", 1000.0)
    beat_at(run_sync, "b", 1000.0)
    run_sync.tick()
    run_sync.clock_state["now"] = 1000.0 + 60  # past the 10 s heartbeat timeout
    beat_at(run_sync, "b", 1060.0)
    run_sync.tick()
    assert run_sync.liveness.lost == run_sync.liveness.unheard == {"a"}
    assert run_sync.status(run_sync.clock())["islands"]["a"]["link"]["state"] == "partitioned"
    beat_at(run_sync, "a", 1060.0)
    run_sync.tick()
    assert run_sync.liveness.lost == run_sync.liveness.unheard == set()
    run_sync.recorder.flush()
    kinds = list(Event.objects.filter(run_id=run_sync.recorder.run_id)
                 .values_list("kind", flat=True))
    assert kinds.count("island_lost") == 1
    assert kinds.count("island_revived") == 1


@pytest.mark.integration
@pytest.mark.django_db
def test_a_reported_death_marks_the_island_lost_on_the_next_pass(run_sync):
    beat_at(run_sync, "a", 1000.0)
    beat_at(run_sync, "b", 1000.0)
    run_sync.tick()
    assert run_sync.liveness.alive == 2 and run_sync.liveness.sending == {"a", "b"}
    run_sync.store.signals.report_death("a", 1, -9, at=1000.2)
    run_sync.clock_state["now"] = 1000.3  # far inside the 10 s heartbeat timeout
    run_sync.control_every_s = 60.0  # the death alone brings the watch forward
    run_sync.next_control = 2000.0
    run_sync.tick()
    assert run_sync.liveness.lost == {"a"} and run_sync.liveness.unheard == set()
    assert run_sync.liveness.alive == 1 and run_sync.liveness.sending == {"b"}
    status = run_sync.status(run_sync.clock())
    run_sync.recorder.flush()
    lost = Event.objects.get(run_id=run_sync.recorder.run_id, kind="island_lost")
    assert lost.detail["cause"] == "died"
    assert (lost.detail["epoch"], lost.detail["exit_code"], lost.detail["signal"]) == (1, -9, 9)
    assert lost.detail["reported_after_s"] == pytest.approx(0.1, abs=1e-6)
    assert status["islands"]["a"]["state"] == "lost"
    # The next epoch speaks: revived.
    run_sync.store.set_epoch("a", 2)
    write_beat(run_sync, "a", epoch=2, time=time.time(), step=0, tokens=0, state="starting")
    run_sync.next_control = 0.0
    run_sync.tick()
    assert run_sync.liveness.lost == set()
    # Alive, but a round of a waiting run does not wait for it before it trains.
    assert (run_sync.liveness.alive, run_sync.liveness.sending) == (2, {"b"})


@pytest.mark.integration
@pytest.mark.django_db
def test_a_step_time_that_spans_a_users_pause_does_not_value_useful_steps(run_sync):
    # 4 steps from 1000 to 1004 with a pause from 1001 to 1003 in between: 1 s a step
    # on the clock, 0.5 s of training. The next 4 steps take 1 s: 0.25 s a step.
    def updates(now: float, seq: int, version: int) -> None:
        run_sync.clock_state["now"] = now
        for island in ("a", "b"):
            beat_at(run_sync, island, now)
            send(run_sync, island, 0, seq, base_version=version)
        run_sync.tick()

    updates(1000.0, 4, 0)
    run_sync.store.control.set_paused(True)
    run_sync.clock_state["now"] = 1001.0
    run_sync.tick()
    run_sync.store.control.set_paused(False)
    run_sync.clock_state["now"] = 1003.0
    run_sync.tick()
    updates(1004.0, 8, 1)
    updates(1005.0, 12, 2)

    assert run_sync.accounting.step_time("a") == pytest.approx(0.25)


@pytest.mark.integration
@pytest.mark.django_db
def test_the_status_shows_each_islands_step_time_and_share_of_its_hosts_cpu(run_sync):
    def beats(at: float, steps: dict[str, int]) -> None:
        for island, step in steps.items():
            write_beat(run_sync, island, epoch=1, time=at, step=step, tokens=step * 32,
                       cpu_share={"a": 0.0625, "b": 0.02}[island])
        run_sync.clock_state["now"] = at
        run_sync.next_control = 0.0
        run_sync.tick()

    beats(1000.0, {"a": 10, "b": 10})
    beats(1002.0, {"a": 30, "b": 14})  # a: 20 steps in 2 s; b, starved: 4

    islands = run_sync.status(run_sync.clock())["islands"]
    assert (islands["a"]["step_time_s"], islands["a"]["cpu_share"]) == (0.1, 0.0625)
    assert (islands["b"]["step_time_s"], islands["b"]["cpu_share"]) == (0.5, 0.02)


@pytest.mark.integration
@pytest.mark.django_db
def test_a_step_longer_than_the_rate_window_is_shown_whole(run_sync):
    # A step of 2 s and heartbeats every 0.5 s: each step's count shows in the first
    # heartbeat after it, at 1000.1, 1002.1, ...
    for i in range(20):
        at = 1000.0 + 0.5 * i
        step = 10 + int((at - 999.9) // 2.0)
        write_beat(run_sync, "a", epoch=1, time=at, step=step, tokens=step * 32)
        run_sync.clock_state["now"] = at
        run_sync.next_control = 0.0
        run_sync.tick()

        if at >= 1004.5:  # two whole steps seen
            assert run_sync.status(at)["islands"]["a"]["step_time_s"] == 2.0, at


@pytest.mark.integration
@pytest.mark.django_db
def test_the_status_shows_the_seconds_each_island_waited_for_merges_and_upload_slots(
        run_sync):
    write_beat(run_sync, "a", epoch=1, time=1000.0, step=4, tokens=128,
               backpressure_wait_s=2.5, slot_wait_s=0.75)
    beat_at(run_sync, "b", 1000.0)  # a heartbeat without either
    run_sync.tick()

    islands = run_sync.status(run_sync.clock())["islands"]
    assert (islands["a"]["backpressure_wait_s"], islands["a"]["slot_wait_s"]) == (2.5, 0.75)
    assert (islands["b"]["backpressure_wait_s"], islands["b"]["slot_wait_s"]) == (0.0, 0.0)


@pytest.mark.integration
@pytest.mark.django_db
def test_the_status_says_whether_a_rejoin_would_start_warm_from_the_regions_pool(run_sync):
    pools = PoolStore(run_sync.store.client)
    pools.put_host("us-east", "host-1", {"ready": 1, "time": time.time()})
    assert {i.region for i in run_sync.spec.config.islands} == {"us-east"}

    warm = run_sync.status(run_sync.clock())["islands"]
    pools.put_host("us-east", "host-1", {"ready": 0, "time": time.time()})
    cold = run_sync.status(run_sync.clock())["islands"]

    assert {i["rejoin_warm"] for i in warm.values()} == {True}
    assert {i["rejoin_warm"] for i in cold.values()} == {False}
