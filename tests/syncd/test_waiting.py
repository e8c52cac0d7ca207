"""syncd's choice of a run's tau, from its islands' heartbeats, written for them."""

import pytest

from diloco.config_parse import parse_config
from syncd.connection import connect
from syncd.records import Heartbeat
from syncd.spec import RunSpec
from syncd.store import RunStore
from syncd.waiting import RunWaiting

CONFIG = {
    "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
    "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2},
    "islands": [{"name": "a", "region": "us-east", "batch_size": 2},
                {"name": "b", "region": "us-east", "batch_size": 2}],
}
STEP_S = 0.5  # a send each 2 steps: windows of 16 s


def waiting(redis_server: str, mode: str = "decoupled", **sync) -> RunWaiting:
    store = RunStore(connect(redis_server), 60)
    store.client.flushall()
    config = {**CONFIG, "sync": {**CONFIG["sync"], **sync}}
    store.put_spec(mode, parse_config(config, ["us-east"]).to_dict(), "00" * 32)
    return RunWaiting(store, RunSpec(store))


def beats(time: float, tokens: int) -> dict[str, Heartbeat]:
    return {name: Heartbeat.bare(1, time, 0, tokens) for name in ("a", "b")}


def run_for(w: RunWaiting, start: float, seconds: int, pace: float) -> float:
    """Each island trains `pace` tokens a second for `seconds`, from `start`."""
    for t in range(seconds):
        now = start + t
        w.observe(now, beats(now, int(pace * now)), STEP_S, 2.0)
    return start + seconds


@pytest.mark.integration
def test_syncd_writes_tau_0_while_it_measures_waiting_and_the_islands_pace_decides(
        redis_server):
    w = waiting(redis_server)
    assert w.tau() == 1 and not w.waits()  # the config's, until syncd chose
    now = run_for(w, 0.0, 16, pace=1000.0)
    assert w.store.control.tau() == 1 == w.tau()  # the first window overlaps, as they start

    now = run_for(w, now, 1, pace=1000.0)
    assert w.store.control.tau() == 0 == w.tau()  # the second waits
    assert w.waits()  # and the run's rounds wait for every island sending
    run_for(w, now, 16, pace=1000.0)  # no slower than overlapping
    assert w.overlap.slowdown() == pytest.approx(0.0, abs=0.01)
    assert w.store.control.tau() == 0


@pytest.mark.integration
def test_syncd_writes_the_configs_tau_where_waiting_slows_the_islands(redis_server):
    w = waiting(redis_server)
    run_for(w, 0.0, 16, pace=1000.0)  # overlapping
    for t in range(16, 33):  # waiting from t = 16: half the tokens a second
        w.observe(float(t), beats(float(t), 16000 + 500 * (t - 16)), STEP_S, 2.0)

    assert w.overlap.slowdown() == pytest.approx(1.0, abs=0.05)
    assert w.store.control.tau() == 1 and not w.waits()


@pytest.mark.integration
def test_a_heartbeat_read_late_moves_nothing_and_nothing_is_chosen_before_step_times(
        redis_server):
    w = waiting(redis_server)
    w.observe(0.0, beats(0.0, 0), None, 2.0)
    assert w.store.control.tau() is None  # no window before step times are known

    for now in range(0, 17):  # syncd reads each heartbeat 0 to 0.9 s after it was written
        beat_time = now - (now % 10) / 10
        w.observe(float(now), beats(beat_time, int(1000 * beat_time)), STEP_S, 2.0)
    assert list(w.overlap.paces["overlap"]) == [pytest.approx(2000.0)]


@pytest.mark.integration
def test_nothing_is_measured_until_every_island_of_the_run_has_trained(redis_server):
    w = waiting(redis_server)
    for now in range(0, 40):  # b starts, then is gone: a window would read its start-up
        beat = {"a": Heartbeat.bare(1, now, 0, 1000 * now)}
        if now < 20:
            beat["b"] = Heartbeat.bare(1, now, 0, 0, state="starting")
        w.observe(float(now), beat, STEP_S, 2.0)
    assert w.store.control.tau() is None and not w.started

    run_for(w, 40.0, 1, pace=1000.0)  # both trained: the first window begins
    assert w.started and w.store.control.tau() == 1


@pytest.mark.integration
@pytest.mark.parametrize("mode, sync", [("sync", {"overlap_steps": 0, "min_quorum": 2}),
                                        ("decoupled", {"wait_share": 0.0}),
                                        ("elastic", {})])
def test_a_run_that_does_not_choose_writes_no_tau(redis_server, mode, sync):
    w = waiting(redis_server, mode, **sync)
    run_for(w, 0.0, 40, pace=1000.0)

    assert w.store.control.tau() is None and not w.waits()


@pytest.mark.integration
@pytest.mark.parametrize("raw", [b"-1", b"one", b"1.5"])
def test_a_tau_key_that_holds_no_whole_number_reads_as_none(redis_server, raw):
    store = RunStore(connect(redis_server), 61)
    store.client.set(store.key("tau"), raw)

    assert store.control.tau() is None
