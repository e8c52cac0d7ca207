"""An island's WAN link to syncd as the status snapshot gives it: its state from the
island's state and active fault, the bytes it carried since the previous status; and
uptime's theta, from the step times, the islands' pace and syncd's tick."""

from types import SimpleNamespace

import pytest

from diloco.accounting import RunAccounting
from diloco.config_parse import parse_config
from syncd.pass_times import PassTimes
from syncd.status import link, link_state, pace, theta

SPEC = SimpleNamespace(elastic=False, barrier=False, config=parse_config({
    "sync": {"inner_steps": 10, "fragments": 2, "min_quorum": 2},
    "islands": [{"name": n, "region": "us-east"} for n in ("a", "b", "c")],
}, ["us-east"]))


def fault_free(step_time_s: float) -> RunAccounting:
    accounting = RunAccounting(["a", "b", "c"], 0.0, fragments=2)
    for island in ("a", "b", "c"):
        accounting.observe_step_time(island, step_time_s, faulted=False)
    return accounting


@pytest.mark.parametrize(("state", "fault", "expected"), [
    ("training", "none", "up"),
    ("starting", "none", "up"),
    ("training", "straggle", "up"),  # a slow island, not a slow link
    ("training", "degrade", "degraded"),
    ("training", "partition", "partitioned"),
    ("lost", "partition", "partitioned"),  # silent because it is cut off
    ("lost", "none", "down"),
    ("stopped", "none", "down"),
    ("pending", "none", "down"),
    ("lost", "degrade", "down"),
])
def test_the_link_state_follows_the_islands_state_and_fault(state, fault, expected):
    assert link_state(state, fault) == expected


def test_a_lost_island_that_no_death_explains_has_its_link_partitioned():
    assert link_state("lost", "none", unheard=True) == "partitioned"


def island(up: int, down: int, state: str = "training", fault: str = "none") -> dict:
    return {"state": state, "fault": fault, "emulated_bytes_up": up,
            "emulated_bytes_down": down}


def test_a_link_carries_the_bytes_sent_since_the_previous_status():
    assert link(island(1500, 9000), island(1000, 4000)) == {
        "state": "up", "bytes_up": 500, "bytes_down": 5000}


def test_a_link_carries_nothing_in_the_first_status():
    assert link(island(1500, 9000), None) == {"state": "up", "bytes_up": 0, "bytes_down": 0}


def test_a_new_epoch_counts_its_bytes_from_zero():
    assert link(island(300, 700), island(1000, 4000))["bytes_up"] == 300


def test_theta_is_twice_h_steps_of_the_kth_fastest_island_when_steps_are_slow():
    assert theta(fault_free(0.5), SPEC, round_trip_s=0.1, tick_s=0.05) == pytest.approx(10.0)


def test_theta_of_millisecond_steps_is_floored_by_a_round_trip_and_syncds_tick():
    # 2 ms steps are due every 20 ms; a merge needs the fragment's 30 ms round trip and
    # a pass of syncd's, 50 ms when it writes the status.
    assert theta(fault_free(0.002), SPEC) == pytest.approx(0.04)
    assert theta(fault_free(0.002), SPEC, round_trip_s=0.03, tick_s=0.05) == \
        pytest.approx(0.16)


def test_islands_going_slower_now_raise_theta_and_going_faster_does_not_lower_it():
    accounting = fault_free(0.1)
    assert theta(accounting, SPEC, pace={"a": 0.3, "b": 0.25, "c": 0.1}) == \
        pytest.approx(2 * 10 * 0.25)
    assert theta(accounting, SPEC, pace={"a": 0.01, "b": 0.01}) == pytest.approx(2.0)


def test_syncds_tick_is_the_typical_seconds_longest_pass_not_a_one_off_hang():
    passes = PassTimes()
    now = 0.0
    for second in range(10):
        now = float(second)
        passes.mark(now)
        now += 0.08  # the status pass
        while now < second + 1 - 0.005:
            passes.mark(now)
            now += 0.005
    passes.mark(20.0)  # a 10 s hang
    passes.mark(20.005)

    assert passes.tick_s == pytest.approx(0.08, abs=0.006)
    assert PassTimes().tick_s == 0.0


def test_an_islands_pace_is_its_seconds_a_step_from_its_heartbeats_tokens_per_second():
    # An inner step is a batch of batch_size x block_size tokens.
    tokens = SPEC.config.islands[0].batch_size * SPEC.config.model.block_size
    assert pace(SPEC, {"a": tokens / 0.25, "b": 0.0}) == {"a": pytest.approx(0.25)}
