"""Quality-adjusted goodput: what a run's allocated compute bought in eval loss, against
a fault-free reference of the same mode and budget (docs/FIGURES.md).

Pure functions of evaluations already made: each evaluation is a model's per-window
losses on the same held-out windows (diloco.evaluation.Evaluator.window_losses), so
that a run and its reference are compared window by window and the interval holds
only the noise of their difference.

- `spaced_in_log_tokens`: which of a fault-free run's checkpoints to evaluate.
- `reference_curve`: the reference's eval curve, the seeds' fault-free runs' checkpoints
  averaged window by window at every token count inside all of them.
- `monotone_fit`, `tokens_to_reach`: the curve fitted non-increasing, and the tokens at
  which it reaches a loss.
- `seconds_after_startup`: allocated island-seconds less start-up, on both sides.
- `quality_adjusted_goodput`: the figure, uncapped, with its interval; `above_one`.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95%: the interval is the loss difference's mean +- Z standard errors.
Z = 1.96

Curve = list[tuple[float, list[float]]]  # (tokens, each window's loss), in token order


@dataclass(frozen=True)
class Reference:
    """A fault-free reference: its curve (reference_curve) and its island-seconds per
    token merged after start-up (seconds_after_startup over the tokens, seeds pooled)."""

    curve: Curve
    s_per_token: float

    def __post_init__(self) -> None:
        if not self.curve or self.curve[0][0] <= 0:
            raise ValueError(f"a reference needs points with tokens above 0, got "
                             f"{[t for t, _ in self.curve[:1]]}")
        if not self.s_per_token > 0:
            raise ValueError(f"s_per_token must be above 0, got {self.s_per_token}")

    def fit(self) -> list[tuple[float, float]]:
        """The monotone fit of the curve's mean losses."""
        return monotone_fit([(t, statistics.fmean(w)) for t, w in self.curve])


def reference_curve(seeds: Sequence[Sequence[tuple[float, Sequence[float]]]]) -> Curve:
    """The seeds' fault-free curves averaged window by window.

    Args:
        seeds: per seed, its checkpoints as (tokens merged, each window's loss), the
            final one among them; checkpoints at 0 tokens are left out.

    Each seed's losses are linear in log-tokens between its checkpoints; the averaged
    curve has a point at every seed's checkpoint that lies inside every seed's range.
    """
    curves = [sorted((t, list(w)) for t, w in seed if t > 0) for seed in seeds]
    if not curves or not all(curves):
        raise ValueError("need at least one seed, each with a checkpoint above 0 tokens")
    widths = {len(w) for c in curves for _, w in c}
    if len(widths) != 1:
        raise ValueError(f"every evaluation must have the same windows, got {sorted(widths)}")
    low, high = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    grid = sorted({t for c in curves for t, _ in c if low <= t <= high})
    return [(t, [statistics.fmean(column) for column in zip(*(_at(c, t) for c in curves),
                                                             strict=True)])
            for t in grid]


def spaced_in_log_tokens(tokens: Sequence[float], most: int) -> list[int]:
    """The indices of at most `most` of `tokens` (a run's checkpoints, in order) to
    evaluate: the one nearest each of `most` points evenly spaced in log-tokens from the
    first above 0 to the last, the last always among them; a few dozen points make the
    curve, however many checkpoints a slow machine wrote."""
    if most < 2:
        raise ValueError(f"most must be at least 2, got {most}")
    above = [i for i, t in enumerate(tokens) if t > 0]
    if len(above) <= most:
        return above
    low, high = math.log(tokens[above[0]]), math.log(tokens[above[-1]])
    chosen = {min(above, key=lambda i: abs(math.log(tokens[i]) - (low + k * (high - low)
                                                                   / (most - 1))))
              for k in range(most)}
    return sorted(chosen | {above[-1]})


def _at(curve: Curve, tokens: float) -> list[float]:
    """A curve's window losses at `tokens` (inside its range), linear in log-tokens."""
    for (t0, w0), (t1, w1) in itertools.pairwise(curve):
        if t0 <= tokens <= t1 and t1 > t0:
            share = math.log(tokens / t0) / math.log(t1 / t0)
            return [a + share * (b - a) for a, b in zip(w0, w1, strict=True)]
    return next(w for t, w in curve if t == tokens)


def monotone_fit(curve: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-increasing least-squares fit (isotonic regression, pool adjacent
    violators) of an eval curve: (tokens, loss) points, tokens above 0, in any order.
    Evaluation noise that makes the loss rise for a while is pooled into a flat stretch."""
    points = sorted(curve)
    if not points or points[0][0] <= 0:
        raise ValueError(f"need points with tokens above 0, got {points[:1]}")
    blocks: list[list[float]] = []  # [sum of losses, count]
    for _, loss in points:
        blocks.append([loss, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [total / count for total, count in blocks for _ in range(int(count))]
    return [(tokens, loss) for (tokens, _), loss in zip(points, fitted, strict=True)]


def tokens_to_reach(fit: Sequence[tuple[float, float]], loss: float) -> float | None:
    """The tokens at which a monotone fit (monotone_fit) first reaches `loss`, linear in
    log-tokens between its points. A loss at or above its first point: that point's
    tokens. A loss below its last point: extrapolated past the end with the fit's
    least-squares slope against log-tokens over the second half of its log-token range
    (its last two points at least: a slope over many points, not the last segment's,
    which a flat tail makes near 0);
    None when that slope does not descend."""
    (first_tokens, first_loss), (last_tokens, last_loss) = fit[0], fit[-1]
    if loss >= first_loss:
        return first_tokens
    for (t0, y0), (t1, y1) in itertools.pairwise(fit):
        if y1 <= loss < y0:
            share = (loss - y0) / (y1 - y0)
            return math.exp(math.log(t0) + share * (math.log(t1) - math.log(t0)))
    middle = math.sqrt(first_tokens * last_tokens)
    tail = [(math.log(t), y) for t, y in fit if t >= middle]
    if len(tail) < 2:  # the last two points at least
        tail = [(math.log(t), y) for t, y in fit[-2:]]
    if len(tail) < 2 or tail[0][0] == tail[-1][0]:
        return None
    slope = statistics.linear_regression([x for x, _ in tail], [y for _, y in tail]).slope
    if slope >= 0:
        return None
    return last_tokens * math.exp((loss - last_loss) / slope)


def seconds_after_startup(allocated_s: float, slots: int, startup_s: float) -> float:
    """Allocated island-seconds after start-up: `slots` (islands and standby slots)
    allocated from the run's start, less each one's `startup_s` (the run's start to its
    first merge, when no token has been merged yet)."""
    after = allocated_s - slots * startup_s
    if not after > 0:
        raise ValueError(f"nothing allocated after start-up: {allocated_s} island-seconds, "
                         f"{slots} slots, start-up {startup_s} s")
    return after


def quality_adjusted_goodput(reference: Reference, window_losses: Sequence[float],
                             allocated_s: float) -> dict[str, float | bool | list | None]:
    """A run's quality-adjusted goodput against `reference`.

    The tokens the reference needed to reach the run's final loss (the mean of
    `window_losses`, its final model on the reference's windows) over the tokens the
    run's `allocated_s` (island-seconds after start-up) train at the reference's
    seconds per token. Its interval: the run's loss +- Z standard errors of its
    window-by-window difference from the reference's point nearest that loss, each end
    read through the fit the same way (None: an end the fit cannot reach).

    Returns value (at most 1), uncapped, interval [low, high] and above_one (uncapped
    above 1: more quality than the run's compute buys its fault-free twin, a figure to
    question); value, uncapped and interval are None where the fit cannot reach the loss.
    """
    if not allocated_s > 0:
        raise ValueError(f"allocated_s must be above 0, got {allocated_s}")
    fit = reference.fit()
    if len(window_losses) != len(reference.curve[0][1]):
        raise ValueError(f"the run was evaluated on {len(window_losses)} windows, its "
                         f"reference on {len(reference.curve[0][1])}")
    loss = statistics.fmean(window_losses)
    nearest = min(reference.curve, key=lambda p: abs(statistics.fmean(p[1]) - loss))[1]
    differences = [a - b for a, b in zip(window_losses, nearest, strict=True)]
    se = statistics.stdev(differences) / math.sqrt(len(differences)) \
        if len(differences) > 1 else 0.0
    trained = allocated_s / reference.s_per_token

    def share(at_loss: float) -> float | None:
        reached = tokens_to_reach(fit, at_loss)
        return None if reached is None else reached / trained

    uncapped = share(loss)
    return {"value": None if uncapped is None else min(1.0, uncapped), "uncapped": uncapped,
            "interval": [share(loss + Z * se), share(loss - Z * se)],
            "above_one": above_one(uncapped), "loss": loss, "loss_se": se}


def above_one(uncapped: float | None) -> bool:
    """Whether a quality-adjusted goodput is above 1, not by a float's rounding: a
    fault-free run against itself reads 1.0000000000000007."""
    return uncapped is not None and uncapped > 1 and not math.isclose(uncapped, 1.0)
