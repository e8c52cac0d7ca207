import math

import pytest

from diloco.accounting import LOST_CAUSES, RunAccounting
from diloco.uptime import fragment_cadence, uptime_from_marks, uptime_theta


def accounting(*islands: str, step_time_s: float = 1.0, start: float = 0.0) -> RunAccounting:
    """A run whose islands have each been seen stepping without a fault."""
    acct = RunAccounting(islands or ("a",), start)
    for island in islands or ("a",):
        acct.observe_step_time(island, step_time_s, faulted=False)
    return acct


def merge_every(acct: RunAccounting, island: str, period: float, until: float, *,
                steps: int, weight: float = 0.5, fragment: int | None = None,
                first: float | None = None) -> None:
    t = period if first is None else first
    while t <= until + 1e-9:
        acct.merged(island, steps, weight, t, fragment=fragment)
        t += period


# -- goodput ---------------------------------------------------------------------------


def test_a_fault_free_island_whose_every_step_was_merged_has_goodput_one():
    acct = accounting("a")
    merge_every(acct, "a", 2.0, 10.0, steps=2)  # 2 steps of 1 s every 2 s

    snap = acct.snapshot(10.0)

    assert snap["useful_s"] == pytest.approx(10.0)
    assert snap["allocated_s"] == pytest.approx(10.0)
    assert snap["goodput"] == pytest.approx(1.0)
    assert snap["islands"]["a"]["goodput"] == pytest.approx(1.0)
    assert acct.goodput(10.0) == pytest.approx(1.0)


def test_lost_time_lowers_goodput_by_exactly_its_share():
    acct = accounting("a", "b")
    acct.merged("a", 100, 0.5, 100.0)
    acct.merged("b", 80, 0.5, 100.0)
    acct.lost("b", 20.0, "in_flight")  # b died with 20 s of unsent work

    snap = acct.snapshot(100.0)

    assert snap["islands"]["a"]["goodput"] == pytest.approx(1.0)
    assert snap["islands"]["b"]["goodput"] == pytest.approx(0.8)
    assert snap["goodput"] == pytest.approx(180 / 200)
    assert snap["lost_s"]["in_flight"] == pytest.approx(20.0)
    assert snap["islands"]["b"]["lost_s"]["in_flight"] == pytest.approx(20.0)
    assert snap["unattributed_s"] == pytest.approx(0.0)


def test_a_pause_is_left_out_of_allocation_for_every_island():
    acct = accounting("a", "b")
    acct.clock.pause(10.0)
    acct.clock.resume(40.0)
    acct.merged("a", 20, 0.5, 50.0)
    acct.merged("b", 20, 0.5, 50.0)

    snap = acct.snapshot(50.0)

    assert acct.allocated_seconds("a", 50.0) == pytest.approx(20.0)
    assert snap["allocated_s"] == pytest.approx(40.0)
    assert snap["wall_s"] == pytest.approx(20.0)
    assert snap["goodput"] == pytest.approx(1.0)


def test_an_open_pause_stops_allocation_until_resumed():
    acct = accounting("a")
    acct.clock.pause(10.0)

    assert acct.clock.paused
    assert acct.allocated_seconds("a", 100.0) == pytest.approx(10.0)


def test_useful_steps_are_valued_at_the_fault_free_step_time_not_the_straggling_one():
    acct = RunAccounting(["a"], 0.0)
    for seconds in (1.0, 1.2, 0.8):
        acct.observe_step_time("a", seconds, faulted=False)
    for _ in range(5):
        acct.observe_step_time("a", 4.0, faulted=True)  # straggling
    acct.merged("a", 10, 1.0, 40.0)

    assert acct.step_time("a") == pytest.approx(1.0)
    assert acct.useful_seconds("a", 40.0) == pytest.approx(10.0)
    assert acct.goodput(40.0) == pytest.approx(0.25)


def test_a_step_is_valued_at_the_step_weighted_mean_not_the_median():
    acct = RunAccounting(["a"], 0.0)
    # Under bursty load most samples are short and a few are long: 3 quick windows of
    # 10 steps at 0.1 s and one slow one of 10 steps at 0.5 s take 8 s for 40 steps.
    for seconds in (0.1, 0.1, 0.1, 0.5):
        acct.observe_step_time("a", seconds, faulted=False, steps=10)

    assert acct.step_time("a") == pytest.approx(0.2)


def test_a_step_time_sample_needs_whole_steps():
    with pytest.raises(ValueError, match="steps must be a whole number of 1 or more, got 0"):
        RunAccounting(["a"], 0.0).observe_step_time("a", 1.0, faulted=False, steps=0)


def test_an_island_without_fault_free_steps_is_valued_at_the_mean_over_all_islands():
    acct = RunAccounting(["a", "b", "c"], 0.0)
    acct.observe_step_time("a", 1.0, faulted=False)
    acct.observe_step_time("b", 2.0, faulted=False)
    acct.observe_step_time("b", 9.0, faulted=False)
    acct.observe_step_time("c", 20.0, faulted=True)
    acct.merged("c", 10, 1.0, 50.0)

    assert acct.step_time("b") == pytest.approx(5.5)
    # The step-weighted mean of 1, 2 and 9 s is 4 s; their median would be 2 s.
    assert acct.step_time("c") == pytest.approx(4.0)
    assert acct.useful_seconds("c", 50.0) == pytest.approx(40.0)


def test_goodput_is_unknown_while_no_fault_free_step_time_was_observed():
    acct = RunAccounting(["a"], 0.0)
    acct.observe_step_time("a", 2.0, faulted=True)
    acct.merged("a", 10, 1.0, 20.0)

    assert acct.goodput(20.0) is None
    assert acct.snapshot(20.0)["islands"]["a"]["useful_s"] is None


def test_a_rollback_takes_back_merges_after_its_point():
    acct = accounting("a")
    for t in (10.0, 20.0, 30.0):
        acct.merged("a", 10, 0.5, t)

    taken = acct.rollback(15.0, 35.0)
    snap = acct.snapshot(35.0)

    assert taken == 20
    assert snap["useful_s"] == pytest.approx(10.0)
    assert snap["lost_s"]["rollback"] == pytest.approx(20.0)
    assert snap["islands"]["a"]["rolled_back_steps"] == 20
    assert snap["merges"] == 1
    assert acct.max_stall(35.0) == pytest.approx(25.0)  # taken-back merges are no marks


def test_a_rollback_of_one_fragment_keeps_the_other_fragments_merges():
    acct = accounting("a")
    acct.merged("a", 10, 0.5, 20.0, fragment=0)
    acct.merged("a", 7, 0.5, 20.0, fragment=1)

    assert acct.rollback(10.0, 25.0, fragment=0) == 10
    assert acct.useful_seconds("a", 25.0) == pytest.approx(7.0)


def test_a_reported_rollback_loss_adds_to_the_taken_back_steps():
    acct = accounting("a")
    acct.merged("a", 10, 0.5, 20.0)
    acct.rollback(10.0, 20.0)
    acct.lost("a", 3.0, "rollback")  # unsent steps thrown away by the restart

    assert acct.snapshot(20.0)["lost_s"]["rollback"] == pytest.approx(13.0)


def test_weight_zero_merges_are_not_useful_but_still_mark_a_merge():
    acct = accounting("a", "b")
    acct.merged("a", 10, 0.0, 10.0)
    acct.merged("b", 10, 1.0, 10.0)

    snap = acct.snapshot(10.0)

    assert snap["islands"]["a"]["useful_s"] == 0.0
    assert snap["islands"]["b"]["useful_s"] == pytest.approx(10.0)
    assert snap["merges"] == 2
    assert snap["merge_events"] == 1
    assert acct.max_stall(10.0) == pytest.approx(10.0)


def test_merged_round_records_every_island_of_one_merge():
    acct = accounting("a", "b")
    acct.merged_round({"a": 0.75, "b": 0.25}, {"a": 6, "b": 2}, 8.0, fragment=0, version=1)

    assert acct.useful_seconds("a", 8.0) == pytest.approx(6.0)
    assert acct.useful_seconds("b", 8.0) == pytest.approx(2.0)
    assert {(e.island, e.fragment, e.version) for e in acct.entries} == {
        ("a", 0, 1), ("b", 0, 1)}


# -- allocation windows ----------------------------------------------------------------


def test_an_island_added_mid_run_is_allocated_from_then():
    acct = accounting("a")
    acct.add_island("b", 40.0)

    assert acct.allocated_seconds("a", 100.0) == pytest.approx(100.0)
    assert acct.allocated_seconds("b", 100.0) == pytest.approx(60.0)
    assert acct.allocated_seconds("b", 30.0) == 0.0


def test_a_removed_island_is_allocated_until_removed_and_keeps_its_useful_steps():
    acct = accounting("a", "b")
    acct.merged("b", 30, 0.5, 30.0)
    acct.remove_island("b", 30.0)

    snap = acct.snapshot(100.0)

    assert snap["islands"]["b"]["allocated_s"] == pytest.approx(30.0)
    assert snap["islands"]["b"]["goodput"] == pytest.approx(1.0)
    assert not snap["islands"]["b"]["in_run"]
    acct.add_island("b", 50.0)
    assert acct.allocated_seconds("b", 100.0) == pytest.approx(30.0 + 50.0)


def test_finishing_the_run_stops_allocation_and_wall_time():
    acct = accounting("a")
    acct.clock.finish(50.0)

    assert acct.allocated_seconds("a", 80.0) == pytest.approx(50.0)
    assert acct.clock.wall_seconds(80.0) == pytest.approx(50.0)


# -- uptime ----------------------------------------------------------------------------


def test_uptime_is_one_when_no_gap_exceeds_theta():
    acct = accounting("a")
    merge_every(acct, "a", 1.0, 10.0, steps=1)

    assert acct.uptime(10.0, theta=2.0) == 1.0
    assert acct.max_stall(10.0) == pytest.approx(1.0)


def test_uptime_leaves_out_the_gaps_that_exceed_theta():
    acct = accounting("a")
    for t in (1.0, 2.0, 4.0, 10.0):  # after start-up (1 s): gaps 1, 2 (= theta), 6
        acct.merged("a", 1, 0.5, t)

    assert acct.uptime(10.0, theta=2.0) == pytest.approx(1 - 6 / 9)
    assert acct.max_stall(10.0) == pytest.approx(6.0)


def test_start_up_is_a_figure_of_its_own_and_no_down_time():
    acct = accounting("a")
    assert acct.uptime(30.0, theta=2.0) is None  # still in start-up
    assert acct.startup_seconds(30.0) == pytest.approx(30.0)
    merge_every(acct, "a", 1.0, 40.0, steps=1, first=30.0)

    assert acct.startup_seconds(40.0) == pytest.approx(30.0)
    assert acct.uptime(40.0, theta=2.0) == 1.0
    assert acct.snapshot(40.0, theta=2.0)["startup_s"] == pytest.approx(30.0)


def test_an_open_stall_counts_once_it_exceeds_theta():
    acct = accounting("a")
    acct.merged("a", 1, 0.5, 1.0)
    acct.merged("a", 1, 0.5, 2.0)

    assert acct.uptime(3.5, theta=2.0) == 1.0
    assert acct.uptime(10.0, theta=2.0) == pytest.approx(1 - 8 / 9)
    assert acct.max_stall(10.0) == pytest.approx(8.0)


def test_a_pause_is_left_out_of_merge_gaps_and_wall_time():
    acct = accounting("a")
    acct.merged("a", 1, 0.5, 1.0)
    acct.clock.pause(1.5)
    acct.clock.resume(50.0)
    acct.merged("a", 1, 0.5, 51.0)

    assert acct.max_stall(51.0) == pytest.approx(1.5)
    assert acct.uptime(51.0, theta=2.0) == 1.0


def test_uptime_falls_only_while_no_fragment_merges():
    acct = RunAccounting(["a"], 0.0, fragments=2)
    acct.observe_step_time("a", 1.0, faulted=False)
    merge_every(acct, "a", 1.0, 5.0, steps=1, fragment=0)
    acct.merged("a", 1, 0.5, 1.5, fragment=1)
    acct.merged("a", 1, 0.5, 9.0, fragment=1)

    # Start-up ends at 1 s; fragment 1 alone is slow from 1.5 to 9, while fragment 0
    # goes on merging until 5: the global model stood still from 5 to 9 only.
    assert acct.uptime(10.0, theta=2.0, fragment=0) == pytest.approx(1 - 5 / 9)
    assert acct.uptime(10.0, theta=2.0, fragment=1) == pytest.approx(1 - 7.5 / 9)
    assert acct.uptime(10.0, theta=2.0) == pytest.approx(1 - 4 / 9)
    assert acct.median_merge_gap(fragment=0) == pytest.approx(1.0)


def test_a_slowdown_that_raised_theta_while_it_lasted_stays_up_once_theta_falls_back():
    acct = accounting("a")
    # Merges every second (theta 2 s), then every 3 s while one island cold-starts
    # beside the others and their steps are measured slower (theta 6 s), then every
    # second again.
    merge_every(acct, "a", 1.0, 10.0, steps=1)
    assert acct.uptime(10.0, theta=2.0) == 1.0
    for t in (13.0, 16.0, 19.0, 22.0):
        assert acct.uptime(t - 1.0, theta=6.0) == 1.0
        acct.merged("a", 1, 0.5, t)
    merge_every(acct, "a", 1.0, 30.0, steps=1, first=23.0)

    assert acct.uptime(30.0, theta=2.0) == 1.0
    # A stall is still down: no merge from 30 to 40, against theta 2 s.
    assert acct.uptime(40.0, theta=2.0) == pytest.approx(1 - 10 / 39)


def test_a_gap_that_saw_no_theta_noted_is_judged_against_the_next_one():
    assert uptime_from_marks([[1.0, 2.0, 8.0]], 1.0, 10.0, 1.0, thetas=[(9.0, 7.0)]) \
        == 1.0
    assert uptime_from_marks([[1.0, 2.0, 8.0]], 1.0, 10.0, 1.0, thetas=[(1.5, 7.0)]) \
        == 1.0  # in force from 1.5 on: at the start of the gap 2 -> 8
    assert uptime_from_marks([[1.0, 2.0, 8.0]], 1.0, 10.0, 1.0,
                             thetas=[(1.5, 7.0), (1.8, 1.0)]) == pytest.approx(1 - 8 / 9)


def test_a_fragments_cadence_is_h_steps_at_the_kth_fastest_islands_step_time():
    assert fragment_cadence([0.3, 0.1, 0.2, None], inner_steps=30, min_quorum=2) == \
        pytest.approx(30 * 0.2)
    assert fragment_cadence([0.1], inner_steps=30, min_quorum=3) == pytest.approx(3.0)
    assert fragment_cadence([None], inner_steps=30, min_quorum=1) is None
    acct = accounting("a", "b", step_time_s=0.5)
    acct.observe_step_time("b", 1.5, faulted=False)  # b: (0.5 + 1.5) / 2 steps = 1 s
    assert acct.cadence(inner_steps=10, min_quorum=1) == pytest.approx(5.0)
    assert acct.cadence(inner_steps=10, min_quorum=2) == pytest.approx(10.0)
    assert uptime_theta(acct.cadence(10, 2)) == pytest.approx(20.0)


def test_theta_is_never_below_twice_a_merges_round_trip_and_syncds_tick():
    # Steps of 2 ms at H = 10 are due every 20 ms; a merge needs a 30 ms round trip of
    # its fragment and a pass of syncd's loop, which status work makes 50 ms long.
    assert uptime_theta(0.02) == pytest.approx(0.04)
    assert uptime_theta(0.02, round_trip_s=0.03, tick_s=0.05) == pytest.approx(0.16)
    assert uptime_theta(5.0, round_trip_s=0.03, tick_s=0.05) == pytest.approx(10.0)


def test_uptime_from_marks_is_what_the_accounting_says():
    acct = RunAccounting(["a"], 0.0, fragments=2)
    for t, p in ((1.0, 0), (2.0, 1), (3.0, 0), (9.0, 1), (10.0, 0)):
        acct.merged("a", 1, 0.5, t, fragment=p)

    assert uptime_from_marks(acct.fragment_marks(), acct.startup_seconds(12.0), 12.0, 3.0) \
        == pytest.approx(acct.uptime(12.0, 3.0))
    assert uptime_from_marks([[1.0, 2.0, 9.0, 10.0]], 1.0, 12.0, 3.0) == \
        pytest.approx(1 - 7 / 11)
    assert uptime_from_marks([[5.0]], 5.0, 5.0, 3.0) is None


def test_the_snapshot_gives_uptime_only_when_theta_is_known():
    acct = accounting("a")
    acct.merged("a", 1, 0.5, 1.0)
    acct.merged("a", 1, 0.5, 7.0)

    without = acct.snapshot(8.0)
    with_theta = acct.snapshot(8.0, theta=2.0)

    assert without["uptime"] is None and without["theta_s"] is None
    assert with_theta["uptime"] == pytest.approx(1 - 6 / 7)
    assert with_theta["max_stall_s"] == pytest.approx(6.0)
    assert set(with_theta["lost_s"]) == set(LOST_CAUSES)


# -- bad inputs ------------------------------------------------------------------------


def paused(acct: RunAccounting) -> RunAccounting:
    acct.clock.pause(1.0)
    return acct


@pytest.mark.parametrize(("call", "message"), [
    (lambda a: a.lost("a", -1.0, "stale"), "seconds must be"),
    (lambda a: a.lost("a", math.nan, "stale"), "seconds must be"),
    (lambda a: a.lost("zz", 1.0, "stale"), "unknown island 'zz'"),
    (lambda a: a.lost("a", 1.0, "gremlins"), "cause must be one of"),
    (lambda a: a.merged("zz", 1, 0.5, 1.0), "unknown island"),
    (lambda a: a.merged("a", -1, 0.5, 1.0), "inner_steps must be"),
    (lambda a: a.merged("a", 1.5, 0.5, 1.0), "inner_steps must be"),
    (lambda a: a.merged("a", 1, -0.1, 1.0), "weight must be"),
    (lambda a: a.merged("a", 1, math.inf, 1.0), "weight must be"),
    (lambda a: a.merged("a", 1, 0.5, -1.0), "not before the start"),
    (lambda a: a.observe_step_time("a", 0.0, faulted=False), "seconds_per_step must be"),
    (lambda a: a.observe_step_time("zz", 1.0, faulted=False), "unknown island"),
    (lambda a: a.uptime(1.0, theta=0.0), "theta must be"),
    (lambda a: a.allocated_seconds("zz", 1.0), "unknown island"),
    (lambda a: a.rollback(5.0, 2.0), "must not be later than now"),
    (lambda a: a.add_island("a", 1.0), "already allocated"),
    (lambda a: a.clock.resume(1.0), "not paused"),
    (lambda a: paused(a).clock.pause(2.0), "already paused"),
    (lambda a: uptime_theta(-1.0), "cadence_s must be"),
])
def test_bad_inputs_raise_value_errors_that_say_what_was_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call(accounting("a"))


def test_a_removed_island_cannot_be_removed_twice_nor_added_after_the_end():
    acct = accounting("a", "b")
    acct.remove_island("b", 5.0)
    with pytest.raises(ValueError, match="already removed"):
        acct.remove_island("b", 6.0)
    acct.clock.finish(10.0)
    with pytest.raises(ValueError, match="ended"):
        acct.add_island("c", 10.0)
    with pytest.raises(ValueError, match="already ended"):
        acct.clock.finish(11.0)


def test_a_step_time_window_below_one_is_refused():
    with pytest.raises(ValueError, match="step_time_window must be 1 or more"):
        RunAccounting(["a"], 0.0, step_time_window=0)


def test_an_island_dead_for_19_of_20_s_after_a_takeover_reads_goodput_one_twentieth():
    # A syncd takes the run over at t = 100; island a's last heartbeat says step 195 and
    # its update of steps 1-200 (0.1 s each) was in flight. It trains 10 steps more, to
    # 205, and dies at 101 with steps 201-205 unsent. Only steps 196-200 were trained
    # in the window and merged: 0.5 s of the 20 allocated.
    acct = RunAccounting(["a"], 100.0)
    acct.trained_before("a", 195)
    acct.observe_step_time("a", 0.1, faulted=False, steps=200)
    acct.merged("a", 200, 1.0, 100.5, seq=200)

    assert acct.useful_seconds("a", 120.0) == pytest.approx(0.5)
    assert acct.goodput(120.0) == pytest.approx(0.5 / 20)
    assert acct.overcredited(120.0) == []


def test_steps_are_credited_past_the_larger_of_each_fragments_handled_seq_and_the_beat():
    acct = RunAccounting(["a"], 0.0, fragments=2)
    acct.observe_step_time("a", 1.0, faulted=False)
    acct.trained_before("a", 90)  # its last heartbeat
    acct.trained_before("a", 96, fragment=1)  # fragment 1's handled seq
    acct.merged("a", 10, 1.0, 1.0, fragment=0, seq=100)  # steps 91-100: all 10 after 90
    acct.merged("a", 10, 1.0, 1.0, fragment=1, seq=100)  # 4 after 96
    acct.merged("a", 10, 1.0, 2.0, fragment=1, seq=110)  # all 10

    assert acct.islands["a"].useful_steps == pytest.approx((10 + 4 + 10) / 2)
    assert acct.rollback(1.5, 3.0) == pytest.approx(10 / 2)  # what was credited


def test_an_island_credited_above_its_allocation_is_reported_not_clipped():
    # An update of 20 one-second steps merged 4 s into the window, with nothing saying
    # they were trained before it: credited in full, and reported.
    acct = RunAccounting(["a", "b"], 100.0)
    acct.observe_step_time("a", 1.0, faulted=False, steps=20)
    acct.merged("a", 20, 1.0, 104.0)

    assert acct.useful_seconds("a", 104.0) == pytest.approx(20.0)
    assert acct.overcredited(104.0) == ["a"]
    snap = acct.snapshot(104.0)
    assert snap["islands"]["a"]["goodput"] == pytest.approx(5.0)
    assert snap["islands"]["a"]["overcredited"] and not snap["islands"]["b"]["overcredited"]
    assert snap["overcredited"] == ["a"]
    assert snap["goodput"] == pytest.approx(20.0 / 8.0)
    assert acct.overcredited(200.0) == []

