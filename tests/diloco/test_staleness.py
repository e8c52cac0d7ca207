import pytest

from diloco.staleness import Staleness, age_gate, percentile, summary


def test_percentile_interpolates_between_the_ordered_values():
    assert percentile([4, 1, 3, 2], 0.5) == pytest.approx(2.5)
    assert percentile([0] * 19 + [10], 0.95) == pytest.approx(0.5)
    assert percentile([], 0.95) == 0.0


def test_a_run_whose_islands_wait_reads_ages_of_zero_or_one():
    staleness = Staleness()
    for merge in range(40):
        staleness.merged({"a": 0, "b": merge % 2, "c": 0})

    assert staleness.run()["max"] <= 1
    assert staleness.island("a") == {"last": 0, "p50": 0, "p95": 0, "max": 0, "count": 40}


def test_a_straggler_reads_its_lag_and_the_others_do_not():
    staleness = Staleness()
    for _ in range(20):
        staleness.merged({"fast-0": 0, "fast-1": 0})
        staleness.merged({"fast-0": 0, "slow": 2})

    assert staleness.island("slow")["p50"] == 2
    assert staleness.island("fast-0")["max"] == 0
    assert staleness.run()["max"] == 2


def test_each_island_keeps_only_its_window_of_ages():
    staleness = Staleness(window=3)
    for age in (9, 1, 1, 1):
        staleness.merged({"a": age})

    assert staleness.island("a")["max"] == 1
    assert summary([])["count"] == 0
    assert staleness.island("never")["last"] == 0


def test_the_cosine_gate_takes_a_fresh_update_whole_and_an_old_one_barely():
    assert age_gate(0, 4, "cosine") == 1.0
    assert age_gate(1, 4, "cosine") == pytest.approx(0.9045, abs=1e-4)
    assert age_gate(4, 4, "cosine") == pytest.approx(0.0955, abs=1e-4)
    assert age_gate(3, 4, "none") == 1.0
    with pytest.raises(ValueError):
        age_gate(1, 4, "linear")
