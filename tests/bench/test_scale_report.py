"""bench scale's arithmetic: the growth slope, the steady rounds, the fitted rise of
the post-merge lows, each size's Redis peak above what it found, the halves' peaks,
each size's memory bounds and its update messages on the data plane."""

import pytest

from bench.scale import (
    HEADER_ALLOWANCE,
    HF_SIZES,
    MAX_LOWS_RISE,
    MIB,
    SIZES,
    P,
    checks,
    estimate_of,
    halves_peak_ratio,
    lows_rise,
    messages_bound,
    params_of,
    peak_above_before,
    post_merge_lows,
    size_config,
    slope_mb_per_min,
    steady,
)
from diloco.sizes import estimate

MESSAGES_OK = {"redis_messages_peak_bytes": 100, "redis_messages_bound_bytes": 100,
               "redis_messages_after_end_bytes": 0}


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


def samples_of(points: list[tuple[float, int, float]]) -> list[dict]:
    return [{"time": t, "round": r, "redis": v} for t, r, v in points]


def test_the_lows_are_the_samples_right_after_each_merge_not_each_rounds_minimum():
    # Merges at 10.5, 12.5 and 12.7 (the last two before one sample), 14.2; the dips at
    # 11 and 13.5 follow no merge. Rounds 3 to 5 are steady (6 is the last).
    samples = samples_of([(10.0, 3, 150.0), (11.0, 3, 90.0), (12.0, 4, 160.0),
                          (13.0, 4, 120.0), (13.5, 4, 80.0), (15.0, 5, 130.0),
                          (16.0, 6, 10.0)])
    merges = [10.5, 12.5, 12.7, 14.2, 15.5]

    assert post_merge_lows(samples, merges, "redis") == [(3, 90.0), (4, 120.0), (5, 130.0)]
    assert post_merge_lows(samples, [], "redis") == []


def test_the_lows_rise_is_the_fitted_rise_over_the_rounds():
    # Post-merge lows 100, 110, 100, 110 in rounds 3 to 6 (7 is the last): the line
    # through them (slope 2 a round) rises by 2 x 3 = 6 from its 102 at round 3.
    samples = samples_of([(float(r), r, v) for r, v in ((3, 100.0), (4, 110.0), (5, 100.0),
                                                        (6, 110.0), (7, 10.0))])
    merges = [r - 0.5 for r in range(3, 8)]
    assert lows_rise(samples, merges, "redis") == pytest.approx(6 / 102)
    flat = [{"time": float(r), "round": r, "syncd": 50.0} for r in range(8)]
    assert lows_rise(flat, merges, "syncd") == 0.0
    assert lows_rise(flat, merges, "island") == 0.0  # a series never sampled
    falling = samples_of([(3.0, 3, 100.0), (4.0, 4, 90.0), (5.0, 5, 80.0)])
    assert lows_rise(falling, [2.5, 3.5], "redis") < 0


def test_a_sizes_redis_peak_leaves_out_what_earlier_sizes_left_behind():
    # 57M left 888 MiB in Redis; 113M's own data adds 400 MiB on top of it.
    before = 888 * MIB
    assert peak_above_before(before, [before, before + 400 * MIB, before + 10 * MIB],
                             peak_stat=before + 420 * MIB, peak_stat_before=1000 * MIB) \
        == 420 * MIB
    # A lifetime peak left by an earlier size, not raised: the sampled peak counts.
    assert peak_above_before(before, [before + 300 * MIB], peak_stat=2000 * MIB,
                             peak_stat_before=2000 * MIB) == 300 * MIB


def test_the_growth_is_the_second_halfs_peak_over_the_first_halfs():
    samples = [{"round": r, "redis": v} for r, v in (
        (3, 100.0), (3, 120.0), (4, 90.0), (4, 150.0), (5, 0.0), (6, 1.0))]
    # Steady rounds 3-5, in time order: 100, 120, 90 | 150, 0.
    assert halves_peak_ratio(samples, "redis") == pytest.approx(150 / 120)
    assert halves_peak_ratio([{"round": 3, "redis": 1.0}], "redis") == 1.0


def test_each_sizes_peaks_are_bounded_by_their_ratio_of_b_and_a_fixed_allowance():
    size = {"label": "11M", "params": 11_000_000, "fp32_bytes": 44_000_000,
            "redis_peak_ratio": 3.5 + 64 * MIB / 44e6 - 0.001, "syncd_peak_ratio": 5.01,
            "island_peak_ratio": 99.0, "lows_rise": MAX_LOWS_RISE, "rounds": 3,
            "islands_lost": [], **MESSAGES_OK}
    out = checks([size])

    assert out["11M redis peak / B"]["ok"]
    assert out["11M redis peak / B"]["bound"] == f"<= {round(3.5 + 64 * MIB / 44e6, 3)}"
    assert not out["11M syncd peak / B"]["ok"]
    assert "11M island peak / B" not in out  # islands are bounded from 50M parameters
    assert out["11M post-merge lows rise"]["ok"] and out["11M rounds"]["ok"]
    assert out["11M islands marked lost (no faults)"]["ok"]
    assert out["11M update messages in flight, bytes"]["ok"]
    assert out["11M update messages left after the end"]["ok"]


def test_the_messages_bound_is_one_largest_update_and_header_per_upload_slot():
    size = SIZES[0]
    config = size_config(size)
    updates = estimate(config).redis.parts["update messages"]

    assert messages_bound(size) == updates + 2 * HEADER_ALLOWANCE
    # codec none: each at least the mean fragment's fp32 bytes
    assert updates >= config.sync.upload_slots * 4 * params_of(size) / P


def test_more_messages_in_flight_than_upload_slots_or_any_left_after_the_end_fail():
    size = {"label": "1M", "params": 1_000_000, "fp32_bytes": 4_000_000,
            "redis_peak_ratio": 1.0, "syncd_peak_ratio": 1.0, "island_peak_ratio": 1.0,
            "lows_rise": 0.0, "rounds": 9, "islands_lost": [],
            "redis_messages_peak_bytes": 101, "redis_messages_bound_bytes": 100,
            "redis_messages_after_end_bytes": 1}
    out = checks([size])

    assert not out["1M update messages in flight, bytes"]["ok"]
    assert out["1M update messages in flight, bytes"]["bound"] == "<= 100"
    assert not out["1M update messages left after the end"]["ok"]


def test_an_island_marked_lost_in_a_run_without_faults_fails_its_check():
    size = {"label": "113M", "params": 113_000_000, "fp32_bytes": 452_000_000,
            "redis_peak_ratio": 1.0, "syncd_peak_ratio": 1.0, "island_peak_ratio": 1.0,
            "lows_rise": 0.0, "rounds": 9,
            "islands_lost": [{"island": "east-0", "time": 0.0, "cause": "silent"}], **MESSAGES_OK}

    assert not checks([size])["113M islands marked lost (no faults)"]["ok"]


def test_the_ladder_ends_with_a_llama_of_at_least_100m_parameters_by_its_library_model():
    from diloco.shapes import parameter_count

    size = HF_SIZES[-1]
    config = size_config(size)

    assert config.model.source == "hf" and size["islands"] == SIZES[-1]["islands"]
    assert params_of(size) == parameter_count(config.model) >= 100_000_000
    assert estimate_of(size)["activations"] > estimate_of(SIZES[-1])["activations"]  # logits
