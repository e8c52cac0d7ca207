"""The goodput benchmark's arithmetic and report: pure functions of what the runs measured.

- `oracle_goodput`: the goodput of a run that lost nothing but what the schedule
  makes inevitable: each failed island's down time (a kill or region outage until
  its next incarnation trains, a partition for its length, the slowed part of a
  straggle), its unsent work (half an outer period of steps, on average, when it
  dies; and at the run's end), the updates the schedule corrupts (one fragment's
  update each), and the islands' first start-up.
- `stall_with_quorum`: the longest gap between merges during which at least K
  islands were alive all along.
- `figure_html`: goodput and global version over time, faults marked (Plotly).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from syncd.chaos import Fault


def oracle_goodput(faults: Iterable[Fault], islands: int, wall_s: float, *, offset_s: float,
                   step_time_s: float, restart_s: float, inner_steps: int, fragments: int,
                   startup_s: Sequence[float] = ()) -> float:
    """The bound on goodput for a schedule over a run of `wall_s` seconds.

    Args:
        faults: the schedule; each fault's at_s counts from the schedule's start.
        islands: M, the islands allocated for the whole run.
        wall_s: the run's length.
        offset_s: when the schedule started, in seconds since the run's start.
        step_time_s: an island's fault-free seconds per inner step.
        restart_s: from a rejoin to the new incarnation's first step.
        inner_steps, fragments: H and P; an island that dies leaves H/2 steps unsent on
            average, and a corrupted update is one fragment's H steps, which goodput
            counts as H/P.
        startup_s: each island's first start-up (run start to its first step).
    """
    if islands < 1 or wall_s <= 0:
        raise ValueError(f"need islands >= 1 and wall_s > 0, got {islands} and {wall_s}")
    unsent = inner_steps / 2 * step_time_s
    lost = sum(min(s, wall_s) for s in startup_s) + islands * unsent  # unsent at the end
    for fault in faults:
        at = offset_s + fault.at_s
        if at >= wall_s:
            continue
        left = wall_s - at
        for _ in fault.islands:
            if fault.kind in ("kill", "region_outage"):
                lost += min(fault.duration_s + restart_s, left) + unsent
            elif fault.kind == "partition":
                lost += min(fault.duration_s, left)
            elif fault.kind == "straggle":
                lost += min(fault.duration_s, left) * (1 - 1 / (fault.factor or 4.0))
            elif fault.kind == "corrupt":
                lost += inner_steps / fragments * step_time_s
    return max(0.0, 1.0 - lost / (islands * wall_s))


def merge_interval(inner_steps: int, fragments: int, step_time_s: float) -> float:
    """The cadence at which the global model is due to change: one of the P fragments
    every H/P inner steps, at the fault-free step time. The measured gaps are shorter
    and uneven (islands out of phase split a fragment's outer step into several merges),
    so twice their median is failed by runs without any fault."""
    if inner_steps < 1 or fragments < 1 or not step_time_s > 0:
        raise ValueError(f"need H >= 1, P >= 1 and a step time above 0, got {inner_steps}, "
                         f"{fragments}, {step_time_s}")
    return inner_steps / fragments * step_time_s


def stall_with_quorum(marks: Sequence[float], wall_s: float,
                      live: Sequence[tuple[float, int]], min_quorum: int) -> float:
    """The longest gap between successive merges (or the last merge and the end) during
    which every sample of the live island count was at least `min_quorum`.

    Args:
        marks: merge times, seconds since the run's start.
        wall_s: the run's length.
        live: (seconds since the start, live islands) samples, in time order.
        min_quorum: K.
    """
    longest = 0.0
    for a, b in itertools.pairwise([*sorted(marks), wall_s]):
        inside = [n for t, n in live if a <= t <= b]
        if inside and min(inside) >= min_quorum:
            longest = max(longest, b - a)
    return longest


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Mean, min, max and max - min of the seeds' values (None where any is missing)."""
    if not values or any(v is None for v in values):
        return {"mean": None, "min": None, "max": None, "spread": None}
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "spread": max(values) - min(values)}


def figure_html(seeds: dict[int, dict[str, Any]], title: str) -> str:
    """A page with, per seed, goodput and the global version over time for each mode,
    the faults marked; x is seconds since the schedule started, so both modes' faults
    fall at the same place."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    parts = [f"<html><head><meta charset='utf-8'><title>{title}</title></head><body>",
             f"<h1>{title}</h1>"]
    colours = {"decoupled": "#1f77b4", "elastic": "#d62728", "elastic_warm": "#ff9896"}
    for n, (seed, runs) in enumerate(sorted(seeds.items())):
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                            subplot_titles=("goodput", "global version (outer steps)"))
        for mode, run in runs.items():
            series = run["series"]
            x = [p["t"] - run["chaos_offset_s"] for p in series]
            fig.add_trace(go.Scatter(x=x, y=[p["goodput"] for p in series], name=mode,
                                     line={"color": colours.get(mode)}, legendgroup=mode),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=x, y=[p["outer_steps"] for p in series], name=mode,
                                     line={"color": colours.get(mode)}, legendgroup=mode,
                                     showlegend=False), row=2, col=1)
        for fault in next(iter(runs.values()))["faults"]:
            fig.add_vrect(x0=fault["at_s"], x1=fault["at_s"] + fault["duration_s"],
                          fillcolor="orange", opacity=0.15, line_width=0,
                          annotation_text=fault["kind"], annotation_position="top left")
        fig.update_layout(title=f"seed {seed}", height=600)
        fig.update_xaxes(title_text="seconds since the fault schedule started", row=2, col=1)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=n == 0))
    parts.append("</body></html>")
    return "\n".join(parts)
