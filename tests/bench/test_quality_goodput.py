"""Quality-adjusted goodput against a fault-free reference of the same mode and budget,
from synthetic loss curves: a loss law in tokens, each window's own difficulty, and
evaluation noise drawn per model."""

import math
import random

import pytest

from bench.quality_goodput import (
    Reference,
    above_one,
    monotone_fit,
    quality_adjusted_goodput,
    reference_curve,
    seconds_after_startup,
    spaced_in_log_tokens,
    tokens_to_reach,
)

WINDOWS = 400
BUDGET = 1_000_000
S_PER_TOKEN = 4e-4  # island-seconds per token merged, after start-up
DIFFICULTY = [random.Random(7).gauss(0.0, 0.5) for _ in range(WINDOWS)]


def law(tokens: float) -> float:
    """The loss a fault-free run reaches after `tokens`: falling, flattening."""
    return 1.6 + 40.0 * tokens ** -0.35


def model_at(tokens: float, rng: random.Random, noise: float = 0.02) -> list[float]:
    """A model's per-window losses after `tokens`: the law, the window's difficulty, and
    this model's own noise."""
    return [law(tokens) + d + rng.gauss(0.0, noise) for d in DIFFICULTY]


def fault_free_curve(seed: int) -> list[tuple[float, list[float]]]:
    """A fault-free run's checkpoints: every 40,000 tokens up to the budget."""
    rng = random.Random(seed)
    return [(float(t), model_at(t, rng)) for t in range(40_000, BUDGET + 1, 40_000)]


def reference(seeds=(1, 3)) -> Reference:
    return Reference(reference_curve([fault_free_curve(s) for s in seeds]), S_PER_TOKEN)


def test_a_fault_free_run_scores_1_within_its_interval():
    run = model_at(BUDGET, random.Random(11))  # another seed's final model, same budget

    figure = quality_adjusted_goodput(reference(), run, BUDGET * S_PER_TOKEN)

    low, high = figure["interval"]
    assert low < 1 < high
    assert figure["uncapped"] == pytest.approx(1, abs=0.25)
    assert figure["value"] == min(1.0, figure["uncapped"])


def test_a_run_that_lost_half_its_compute_scores_about_half():
    ref, rng = reference(), random.Random(12)
    # Stopped at the same allocation after training half the tokens...
    halfway = quality_adjusted_goodput(ref, model_at(BUDGET / 2, rng), BUDGET * S_PER_TOKEN)
    # ...or trained the whole budget in twice the island-seconds.
    doubled = quality_adjusted_goodput(ref, model_at(BUDGET, rng), 2 * BUDGET * S_PER_TOKEN)

    for figure in (halfway, doubled):
        low, high = figure["interval"]
        assert low < 0.5 < high
        assert figure["uncapped"] == pytest.approx(0.5, abs=0.12)
        assert not figure["above_one"]


def test_the_interval_is_the_noise_of_the_difference_not_of_the_windows_difficulty():
    # The windows' difficulty (0.5 nats apart) is shared by the run and its reference,
    # so it leaves the interval narrow; only each model's own noise widens it.
    ref = reference()
    quiet = quality_adjusted_goodput(ref, model_at(BUDGET / 2, random.Random(5), 0.01),
                                     BUDGET * S_PER_TOKEN)
    noisy = quality_adjusted_goodput(ref, model_at(BUDGET / 2, random.Random(5), 0.2),
                                     BUDGET * S_PER_TOKEN)

    def width(figure):
        return figure["interval"][1] - figure["interval"][0]

    assert width(quiet) < 0.1 < width(noisy)
    assert quiet["loss_se"] < 0.5 / math.sqrt(WINDOWS)


def test_a_run_above_its_reference_is_shown_uncapped_and_flagged():
    # A final loss the reference reaches only at twice the budget: 2 by its fit's slope.
    run = [law(2 * BUDGET) + d for d in DIFFICULTY]

    figure = quality_adjusted_goodput(reference(), run, BUDGET * S_PER_TOKEN)

    assert figure["value"] == 1.0
    assert figure["uncapped"] > 1.5
    assert figure["above_one"]
    # A fault-free run against itself is 1 up to a float's rounding: not flagged.
    assert not above_one(1.0000000000000007) and above_one(1.001) and not above_one(None)


def test_the_reference_is_the_seeds_curves_averaged_window_by_window():
    a = [(100.0, [3.0, 2.0]), (1000.0, [2.0, 1.0]), (10_000.0, [1.0, 1.0])]
    b = [(0.0, [9.0, 9.0]), (1000.0, [2.4, 1.4]), (5000.0, [1.6, 1.2])]

    curve = reference_curve([a, b])

    # Inside both seeds' ranges (1000 to 5000 tokens), at each seed's checkpoints there;
    # a's losses at 5000 tokens are linear in log-tokens between its 1000 and 10,000.
    share = math.log(5) / math.log(10)
    assert [t for t, _ in curve] == [1000.0, 5000.0]
    assert curve[0][1] == pytest.approx([2.2, 1.2])
    assert curve[1][1] == pytest.approx([(2 - share + 1.6) / 2, (1 + 1.2) / 2])
    with pytest.raises(ValueError, match="same windows"):
        reference_curve([a, [(1000.0, [1.0])]])


def test_seconds_are_counted_after_start_up():
    # 4 islands and 4 standby slots over 100 s, the first merge at 10 s.
    assert seconds_after_startup(800.0, 8, 10.0) == pytest.approx(720.0)
    with pytest.raises(ValueError, match="after start-up"):
        seconds_after_startup(80.0, 8, 10.0)


def test_the_monotone_fit_pools_a_rise_into_a_flat_stretch():
    fit = monotone_fit([(400, 2.0), (100, 3.0), (200, 2.4), (300, 2.6), (800, 1.5)])

    assert [t for t, _ in fit] == [100, 200, 300, 400, 800]
    assert [y for _, y in fit] == pytest.approx([3.0, 2.5, 2.5, 2.0, 1.5])
    with pytest.raises(ValueError, match="tokens above 0"):
        monotone_fit([(0, 5.0)])


def test_the_tokens_to_reach_a_loss_are_interpolated_in_log_tokens():
    fit = [(100.0, 3.0), (10_000.0, 2.0)]

    assert tokens_to_reach(fit, 2.5) == pytest.approx(1000.0)  # halfway in log-tokens
    assert tokens_to_reach(fit, 3.5) == 100.0  # reached by the first evaluation
    # The first point of a flat stretch is where its loss is reached.
    assert tokens_to_reach([(100.0, 3.0), (1000.0, 2.0), (10_000.0, 2.0)], 2.0) == \
        pytest.approx(1000.0)


def test_past_the_end_the_slope_is_fitted_over_the_tail_not_its_last_segment():
    # 1 nat a decade, then a flat last segment from evaluation noise: the tail's
    # least-squares slope (its second half in log-tokens: 10^2 to 10^4) still descends,
    # where the last segment's would read a small difference as a huge token factor.
    fit = [(1.0, 6.0), (10.0, 5.0), (100.0, 4.0), (1000.0, 3.0), (10_000.0, 3.0)]

    reached = tokens_to_reach(fit, 2.9)

    assert 10_000 < reached < 10_000 * 10 ** (0.1 / 0.5) * 1.01
    assert tokens_to_reach([(100.0, 3.0), (1000.0, 3.0)], 2.0) is None
    assert tokens_to_reach([(100.0, 3.0)], 2.0) is None


def test_a_few_dozen_checkpoints_spaced_in_log_tokens_make_the_curve():
    # 140 checkpoints of a slow run, two before anything merged: 8 chosen, even in
    # log-tokens (1000 to 10^6: a point every 10^(3/7)), the final one always.
    tokens = [0, 0, *range(1000, 1_000_001, 7190)]

    chosen = [tokens[i] for i in spaced_in_log_tokens(tokens, 8)]

    assert chosen[0] == 1000 and chosen[-1] == tokens[-1] and chosen == sorted(chosen)
    assert len(chosen) <= 8
    assert spaced_in_log_tokens([0, 5, 10], 8) == [1, 2]
