"""bench scale's arithmetic: the growth slope, the steady rounds, the rise of the
post-merge lows and the halves' peaks, and each size's memory bounds."""

import pytest

from bench.scale import (
    MAX_LOWS_RISE,
    MIB,
    checks,
    halves_peak_ratio,
    lows_rise,
    slope_mb_per_min,
    steady,
)


def test_the_slope_is_the_least_squares_fit_in_mb_a_minute():
    # About 1 MB more every 30 s: the fit gives 32 kB a second, 1.92 MB a minute.
    points = [(0.0, 0.0), (30.0, 1.2e6), (60.0, 1.8e6), (90.0, 3.0e6)]
    assert slope_mb_per_min(points) == pytest.approx(1.92)
    assert slope_mb_per_min([(t, 5e6) for t in (0.0, 1.0, 2.0, 3.0)]) == 0.0
    assert slope_mb_per_min([(0.0, 0.0), (1.0, 1e9)]) == 0.0  # too few points to fit
    assert slope_mb_per_min([(1.0, 0.0), (1.0, 1.0), (1.0, 2.0)]) == 0.0  # no time span


def test_the_steady_samples_run_from_round_3_to_the_round_before_the_last():
    samples = [{"round": r} for r in (0, 1, 2, 3, 4, 5, 6, 6)]
    assert [s["round"] for s in steady(samples)] == [3, 4, 5]
    assert steady([]) == []


def test_the_lows_rise_compares_the_halves_highest_post_merge_lows():
    # Rounds 3-6 are steady (7 is the last). Each round's low: 100, 104 | 103, 110.
    samples = [{"round": r, "redis": v} for r, v in (
        (2, 1.0), (3, 150.0), (3, 100.0), (4, 104.0), (4, 160.0), (5, 103.0), (6, 110.0),
        (6, 300.0), (7, 10.0))]
    assert lows_rise(samples, "redis") == pytest.approx(110 / 104 - 1)
    flat = [{"round": r, "syncd": 50.0} for r in range(8)]
    assert lows_rise(flat, "syncd") == 0.0
    assert lows_rise(flat, "island") == 0.0  # a series never sampled


def test_the_growth_is_the_second_halfs_peak_over_the_first_halfs():
    samples = [{"round": r, "redis": v} for r, v in (
        (3, 100.0), (3, 120.0), (4, 90.0), (4, 150.0), (5, 0.0), (6, 1.0))]
    # Steady rounds 3-5, in time order: 100, 120, 90 | 150, 0.
    assert halves_peak_ratio(samples, "redis") == pytest.approx(150 / 120)
    assert halves_peak_ratio([{"round": 3, "redis": 1.0}], "redis") == 1.0


def test_each_sizes_peaks_are_bounded_by_their_ratio_of_b_and_a_fixed_allowance():
    size = {"label": "11M", "params": 11_000_000, "fp32_bytes": 44_000_000,
            "redis_peak_ratio": 3.5 + 64 * MIB / 44e6 - 0.001, "syncd_peak_ratio": 5.01,
            "island_peak_ratio": 99.0, "lows_rise": MAX_LOWS_RISE, "rounds": 3}
    out = checks([size])

    assert out["11M redis peak / B"]["ok"]
    assert out["11M redis peak / B"]["bound"] == f"<= {round(3.5 + 64 * MIB / 44e6, 3)}"
    assert not out["11M syncd peak / B"]["ok"]
    assert "11M island peak / B" not in out  # islands are bounded from 50M parameters
    assert out["11M post-merge lows rise"]["ok"] and out["11M rounds"]["ok"]
