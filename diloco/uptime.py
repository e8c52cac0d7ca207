"""Uptime, as docs/FIGURES.md defines it: the share of the time after start-up in which
the global model advances, judged gap by gap against theta, at least twice a fragment's
cadence. Pure: every figure is computed from the seconds it is handed.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable


def fragment_cadence(step_times: Iterable[float | None], inner_steps: int,
                     min_quorum: int) -> float | None:
    """How often one fragment is due to merge: every H inner steps, at the step time of
    the K-th fastest island (a round waits for K updates). None without a step time."""
    if inner_steps < 1 or min_quorum < 1:
        raise ValueError(f"need H >= 1 and K >= 1, got {inner_steps} and {min_quorum}")
    times = sorted(checked_seconds("step time", t, positive=True) for t in step_times
                   if t is not None)
    return inner_steps * times[min(min_quorum, len(times)) - 1] if times else None


def uptime_theta(cadence_s: float, *, round_trip_s: float = 0.0, tick_s: float = 0.0
                 ) -> float:
    """theta for `uptime`: twice a fragment's cadence (fragment_cadence), and never less
    than twice what one merge needs whatever the step time: a fragment's round trip
    (its upload and the globals' download) and syncd's tick (a pass of its loop, whose
    status, evaluation or flush work delays the merge that comes due during it)."""
    cadence_s = checked_seconds("cadence_s", cadence_s, positive=True)
    needs = checked_seconds("round_trip_s", round_trip_s) + checked_seconds("tick_s", tick_s)
    return 2.0 * max(cadence_s, needs)


def uptime_from_marks(fragment_marks: Iterable[Iterable[float]], startup_s: float,
                      wall_s: float, theta: float,
                      thetas: Iterable[tuple[float, float]] = ()) -> float | None:
    """1 - (the gaps between the end of start-up, each merge mark of any fragment and
    `wall_s` that were longer than their theta) / (`wall_s` - start-up): down is only
    where the global model stopped advancing, a slowdown of one fragment is not.

    A gap's theta is the largest in force while it was open: of `thetas`, the (wall
    second, theta) noted as the run went (RunAccounting.note_theta), the one noted last
    at or before its start and every one noted within it, and `theta` as the one in
    force at `wall_s`; a gap that saw no theta takes the first noted after it. So a
    slowdown that raised theta while it lasted stays up once theta falls back. Marks
    are seconds of wall time since the run's start; None while in start-up."""
    theta = checked_seconds("theta", theta, positive=True)
    wall_s = checked_seconds("wall_s", wall_s)
    startup_s = checked_seconds("startup_s", startup_s)
    if wall_s <= startup_s:
        return None
    notes = sorted((t, checked_seconds("theta", th, positive=True)) for t, th in thetas
                   if t < wall_s)
    notes.append((wall_s, theta))
    marks = sorted({m for fragment in fragment_marks for m in fragment
                    if startup_s < m <= wall_s})
    points = [startup_s, *marks, wall_s]
    down, first = 0.0, 0  # notes[first]: the last noted at or before the gap's start
    for a, b in itertools.pairwise(points):
        while first + 1 < len(notes) and notes[first + 1][0] <= a:
            first += 1
        last = bisect.bisect_right(notes, b, key=lambda note: note[0])
        in_force = notes[first:last] if notes[first][0] <= a or last > first \
            else notes[first:first + 1]
        if b - a > max(th for _, th in in_force):
            down += b - a
    return 1.0 - down / (wall_s - startup_s)


def checked_seconds(name: str, value: float, *, positive: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "above 0" if positive else "0 or more"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value}")
    return value
