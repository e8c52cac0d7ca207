"""The goodput benchmark's arithmetic: the oracle bound from the schedule alone, the
system's own costs, one clock for both modes, stalls with a quorum alive, the spread
over seeds, and the report page."""

import pytest

from bench.goodput import figures, oracle_of
from bench.goodput_report import (
    figure_html,
    merge_interval,
    oracle_goodput,
    revalued_goodput,
    scheduled_loss,
    spread,
    stall_with_quorum,
    system_costs,
)
from syncd.chaos import Fault

BASE = {"step_time_s": 0.1, "inner_steps": 10, "fragments": 2}


def test_without_faults_the_oracle_loses_nothing():
    assert oracle_goodput([], 4, 100.0, **BASE) == 1.0


def test_a_kill_costs_its_down_time_and_stretches_the_horizon_by_it():
    kill = Fault(10.0, "kill", ("a",), 10.0)
    # 4 islands train 4 x 100 s of work; 10 island-seconds lost make the run 102.5 s.
    assert oracle_goodput([kill], 4, 100.0, **BASE) == pytest.approx(1 - 10.0 / (4 * 102.5))


def test_each_kind_costs_what_it_takes_away():
    lost = {
        "partition": 8.0,
        "straggle": 8.0 * (1 - 1 / 4),
        "corrupt": 10 / 2 * 0.1,  # one fragment's update of H steps counts H/P
        "degrade": 0.0,
    }
    for kind, seconds in lost.items():
        fault = Fault(10.0, kind, ("a",), 8.0, 4.0 if kind == "straggle" else None)
        bound = oracle_goodput([fault], 1, 100.0, **BASE)
        assert bound == pytest.approx(1 - seconds / (100 + seconds)), kind


def test_faults_after_the_horizon_do_not_count_and_the_last_is_cut_at_it():
    late = Fault(95.0, "partition", ("a",), 10.0)  # the horizon grows to 110 s: all of it
    after = Fault(120.0, "kill", ("a",), 10.0)
    assert oracle_goodput([late, after], 1, 100.0, **BASE) == pytest.approx(1 - 10 / 110)
    assert scheduled_loss([late], 100.0, **BASE) == pytest.approx(5.0)


def test_a_region_outage_costs_every_island_it_hits():
    outage = Fault(10.0, "region_outage", ("a", "b"), 10.0)
    assert oracle_goodput([outage], 2, 100.0, **BASE) == pytest.approx(1 - 20 / (2 * 110))


def test_the_oracle_bound_does_not_move_with_the_measured_rejoin_time():
    config = {"islands": [{}] * 4, "sync": {"inner_steps": 10, "fragments": 2}}
    fault_free = {"outcome": {"wall_s": 60.0, "startup_s": 5.0}, "step_time_s": 0.1}
    faults = [{"at_s": 10.0, "kind": "kill", "island": "a", "duration_s": 8.0,
               "factor": None}]
    bound = oracle_of(faults, fault_free, config)
    slow, quick = (faulted_run(rejoin_s) for rejoin_s in (30.0, 1.0))
    steps = {"a": 0.1, "b": 0.1}

    assert figures(slow, 2, steps)["system_costs"]["rejoin"] > \
        figures(quick, 2, steps)["system_costs"]["rejoin"]
    assert oracle_of(slow["faults"], fault_free, config) == bound
    assert oracle_of(quick["faults"], fault_free, config) == bound
    assert bound == pytest.approx(1 - 8 / (4 * 57.0))


def faulted_run(rejoin_s: float) -> dict:
    outcome = {"goodput": 0.8, "allocated_s": 200.0, "tokens_merged": 1000, "uptime": 0.9,
               "startup_s": 5.0, "theta_s": 1.0, "max_stall_s": 2.0, "wall_s": 50.0,
               "lost_s": {"in_flight": 1.0}, "unattributed_s": 0.0, "eval_loss": 2.0,
               "merge_marks": [1.0, 2.0],
               "islands": {"a": {"useful_steps": 900}, "b": {"useful_steps": 700}}}
    return {"outcome": outcome, "startup_s": [5.0, 5.0], "rejoin_s": [rejoin_s],
            "series": [{"t": 1.0, "live": 2}], "rollbacks": 0, "run": 1,
            "faults": [{"at_s": 10.0, "kind": "kill", "island": "a", "duration_s": 8.0,
                        "factor": None}]}


def test_both_modes_are_valued_at_one_clock_and_costs_are_shares_of_allocation():
    assert revalued_goodput({"a": 100, "b": 50}, {"a": 0.1, "b": 0.2}, 40.0) == \
        pytest.approx((10 + 10) / 40)
    costs = system_costs([2.0, 3.0], [4.0], {"in_flight": 1.0, "rollback": 0.0}, 100.0)
    assert costs == pytest.approx({"startup": 0.05, "rejoin": 0.04, "in_flight": 0.01,
                                   "rollback": 0.0})
    figures_of = figures(faulted_run(2.0), 2, {"a": 0.1, "b": 0.1})
    assert figures_of["goodput"] == pytest.approx((900 + 700) * 0.1 / 200)
    assert figures_of["goodput_syncd"] == 0.8
    assert figures_of["tokens_per_island_s"] == pytest.approx(1000 / 200)


def test_it_rejects_an_empty_run():
    with pytest.raises(ValueError, match="fault_free_s"):
        oracle_goodput([], 4, 0.0, **BASE)


def test_a_stall_counts_only_while_a_quorum_is_alive():
    marks = [1.0, 2.0, 10.0, 11.0]
    live = [(t / 2, 1 if 4 <= t / 2 <= 8 else 3) for t in range(0, 25)]
    # The 2 -> 10 gap had only 1 island alive for a while; 10 -> 11 -> 12 are short.
    assert stall_with_quorum(marks, 12.0, live, 2) == pytest.approx(1.0)
    assert stall_with_quorum(marks, 12.0, live, 1) == pytest.approx(8.0)


def test_the_spread_over_seeds():
    assert spread([0.9, 0.8]) == pytest.approx({"mean": 0.85, "min": 0.8, "max": 0.9,
                                                "spread": 0.1})
    assert spread([0.9, None])["mean"] is None


def test_the_report_page_marks_the_faults():
    run = {"series": [{"t": 0.0, "goodput": None, "outer_steps": 0},
                      {"t": 5.0, "goodput": 0.9, "outer_steps": 3}],
           "chaos_offset_s": 1.0,
           "faults": [{"at_s": 2.0, "kind": "kill", "duration_s": 3.0}]}
    page = figure_html({0: {"decoupled": run, "elastic": run}}, "goodput")
    assert page.startswith("<html>") and "seed 0" in page and "kill" in page


def test_the_merge_interval_is_one_fragment_every_h_over_p_steps():
    assert merge_interval(30, 2, 0.02) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="step time above 0"):
        merge_interval(30, 2, 0.0)
