"""The goodput benchmark's arithmetic: the oracle bound, stalls with a quorum alive,
uptime from merge marks, the spread over seeds, and the report page."""

import pytest

from bench.goodput_report import (
    figure_html,
    merge_interval,
    oracle_goodput,
    spread,
    stall_with_quorum,
)
from syncd.chaos import Fault

BASE = {"offset_s": 0.0, "step_time_s": 0.1, "restart_s": 5.0, "inner_steps": 10,
        "fragments": 2}


def test_without_faults_the_oracle_loses_only_the_start_and_the_unsent_tail():
    # 4 islands x 100 s; each starts in 2 s and leaves H/2 = 5 steps of 0.1 s unsent.
    bound = oracle_goodput([], 4, 100.0, startup_s=[2.0] * 4, **BASE)
    assert bound == pytest.approx(1 - (4 * 2.0 + 4 * 0.5) / 400)


def test_a_kill_costs_its_down_time_the_restart_and_the_unsent_work():
    kill = Fault(10.0, "kill", ("a",), 10.0)
    bound = oracle_goodput([kill], 4, 100.0, **BASE)
    assert bound == pytest.approx(1 - (4 * 0.5 + 10.0 + 5.0 + 0.5) / 400)


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
        assert bound == pytest.approx(1 - (0.5 + seconds) / 100), kind


def test_faults_after_the_end_do_not_count_and_the_last_is_cut_at_the_end():
    late = Fault(95.0, "partition", ("a",), 10.0)
    after = Fault(120.0, "kill", ("a",), 10.0)
    bound = oracle_goodput([late, after], 1, 100.0, **{**BASE, "offset_s": 0.0})
    assert bound == pytest.approx(1 - (0.5 + 5.0) / 100)
    shifted = oracle_goodput([Fault(90.0, "partition", ("a",), 4.0)], 1, 100.0,
                             **{**BASE, "offset_s": 8.0})
    assert shifted == pytest.approx(1 - (0.5 + 2.0) / 100)


def test_a_region_outage_costs_every_island_it_hits():
    outage = Fault(10.0, "region_outage", ("a", "b"), 10.0)
    bound = oracle_goodput([outage], 2, 100.0, **BASE)
    assert bound == pytest.approx(1 - (2 * 0.5 + 2 * 15.5) / 200)


def test_it_rejects_an_empty_run():
    with pytest.raises(ValueError, match="wall_s"):
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
