"""The simulator's sweeps (diloco/simsweep.py): the tables the page and the benchmark show,
and the bandwidth study."""

import pytest

from diloco.simsweep import bandwidth_utilization, run_sweep


def test_int4_streaming_keeps_a_12b_model_busy_at_2_gbps():
    assert bandwidth_utilization("streaming_int4", 2.0) >= 0.95
    assert bandwidth_utilization("data_parallel", 2.0) < 0.05


def test_a_small_sweep_returns_the_tables_and_reports_progress():
    seen = []
    out = run_sweep({"chips": [2000], "islands": [2], "duration_s": 600.0,
                     "bandwidth_gbps": [10.0], "knobs": False}, seen.append)
    assert [(r["mode"], r["islands"]) for r in out["goodput_table"]] == [
        ("dp", 1), ("elastic", 1), ("decoupled", 2)]
    assert {"mode", "islands", "chips", "goodput", "uptime"} <= set(out["goodput_table"][0])
    assert len(out["bandwidth_table"]) == 4 and seen[-1] == 1.0


def test_a_sweep_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown sweep keys"):
        run_sweep({"chip": [1]})
