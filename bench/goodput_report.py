"""The goodput benchmark's arithmetic and report: pure functions of what the runs measured.

- `oracle_goodput`: the goodput of a system that loses nothing but what the
  schedule itself takes (each failed island's down time until the schedule
  heals it, a partition for its length, the slowed part of a straggle, one
  fragment's update per corruption), from the schedule alone: no figure of the
  run it judges goes in.
- `system_costs`: the system's own costs in a run (start-up, rejoin, in-flight
  work and every other cause syncd books), each measured, as shares of the run's
  allocated island-seconds: a slow rejoin shows here as a loss instead of
  raising the bound.
- `revalued_goodput`: useful steps at given step times, one per island (the
  same invocation's fault-free decoupled run's), so that both modes are valued
  on one clock.
- `stall_with_quorum`: the longest gap between merges during which at least K
  islands were alive all along.
- `figure_html`: goodput and global version over time, faults marked, and each
  run's final test loss against its mode's reference fit (Plotly).

Quality-adjusted goodput has a module of its own (bench/quality_goodput.py).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from diloco.chaos import Fault


def scheduled_loss(faults: Iterable[Fault], horizon_s: float, *, step_time_s: float,
                   inner_steps: int, fragments: int) -> float:
    """The island-seconds a schedule takes within `horizon_s` of its start."""
    lost = 0.0
    for fault in faults:
        if fault.at_s >= horizon_s:
            continue
        left = horizon_s - fault.at_s
        for _ in fault.islands:
            if fault.kind in ("kill", "region_outage", "partition"):
                lost += min(fault.duration_s, left)
            elif fault.kind == "straggle":
                lost += min(fault.duration_s, left) * (1 - 1 / (fault.factor or 4.0))
            elif fault.kind == "corrupt":
                lost += inner_steps / fragments * step_time_s
    return lost


def oracle_goodput(faults: Sequence[Fault], islands: int, fault_free_s: float, *,
                   step_time_s: float, inner_steps: int, fragments: int,
                   standby: int = 0) -> float:
    """The bound on goodput for a schedule, from the schedule alone.

    An oracle system trains every island at its fault-free speed from the first step
    and loses only what the schedule takes (scheduled_loss). It trains the budget in
    `fault_free_s` plus the lost island-seconds spread over the islands, and its
    goodput is (islands x that horizon - lost) / ((islands + standby) x that horizon):
    standby slots are allocated capacity that trains nothing, as in the runs it
    bounds. Start-up, rejoin and in-flight work are the system's own costs, measured
    on lines of their own (system_costs).

    Args:
        faults: the schedule; each fault's at_s counts from the schedule's start,
            which is when every island trains.
        islands: M, the islands allocated for the whole run.
        fault_free_s: the seconds the budget takes without faults, start-up left out
            (the same invocation's fault-free decoupled run).
        step_time_s: fault-free seconds per inner step (of that run).
        inner_steps, fragments: H and P; a corrupted update is one fragment's H steps,
            which goodput counts as H/P.
        standby: warm standby slots allocated beside the islands for the whole run.
    """
    if islands < 1 or fault_free_s <= 0 or standby < 0:
        raise ValueError(f"need islands >= 1, fault_free_s > 0 and standby >= 0, got "
                         f"{islands}, {fault_free_s} and {standby}")
    horizon, lost = fault_free_s, 0.0
    for _ in range(100):  # the horizon grows with what it loses: its fixed point
        lost = scheduled_loss(faults, horizon, step_time_s=step_time_s,
                              inner_steps=inner_steps, fragments=fragments)
        longer = fault_free_s + lost / islands
        if abs(longer - horizon) < 1e-9:
            break
        horizon = longer
    return (islands * horizon - lost) / ((islands + standby) * horizon)


def goodput_fields_above_one(tree: Any, path: str = "") -> list[str]:
    """The paths of every field named `goodput` in `tree` (dicts and lists, nested)
    whose value is above 1: goodput is a share of allocated time, so each is a bug."""
    if isinstance(tree, Mapping):
        found = []
        for key, value in tree.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "goodput" and isinstance(value, int | float) and value > 1:
                found.append(where)
            found += goodput_fields_above_one(value, where)
        return found
    if isinstance(tree, list | tuple):
        return [p for n, item in enumerate(tree) for p in goodput_fields_above_one(
            item, f"{path}[{n}]")]
    return []


def system_costs(startup_s: Sequence[float], rejoin_s: Sequence[float],
                 lost_s: Mapping[str, float], allocated_s: float) -> dict[str, float]:
    """The system's own costs in one run, each measured, as shares of its allocated
    island-seconds: every island's first start-up, each rejoin's time to its first
    step, and each cause of loss syncd booked (in_flight: work an epoch that
    ended had not sent; stale, rejected, rollback, restart_pause, barrier_wait)."""
    if allocated_s <= 0:
        raise ValueError(f"allocated_s must be above 0, got {allocated_s}")
    costs = {"startup": sum(startup_s), "rejoin": sum(rejoin_s), **lost_s}
    return {cause: seconds / allocated_s for cause, seconds in costs.items()}


def revalued_goodput(useful_steps: Mapping[str, float], step_time_s: Mapping[str, float],
                     allocated_s: float) -> float:
    """Useful island-seconds with each island's useful steps valued at `step_time_s`
    (island -> seconds per step), over allocated island-seconds."""
    if allocated_s <= 0:
        raise ValueError(f"allocated_s must be above 0, got {allocated_s}")
    return sum(steps * step_time_s[island] for island, steps in useful_steps.items()) \
        / allocated_s


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
                      alive: Sequence[tuple[float, int]], min_quorum: int) -> float:
    """The longest gap between successive merges (or the last merge and the end) during
    which every sample of the alive island count was at least `min_quorum`.

    Args:
        marks: merge times, seconds since the run's start.
        wall_s: the run's length.
        alive: (seconds since the start, alive islands) samples, in time order.
        min_quorum: K.
    """
    longest = 0.0
    for a, b in itertools.pairwise([*sorted(marks), wall_s]):
        inside = [n for t, n in alive if a <= t <= b]
        if inside and min(inside) >= min_quorum:
            longest = max(longest, b - a)
    return longest


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Mean, min, max and max - min of the seeds' values (None where any is missing)."""
    if not values or any(v is None for v in values):
        return {"mean": None, "min": None, "max": None, "spread": None}
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "spread": max(values) - min(values)}


def figure_html(seeds: dict[int, dict[str, Any]], title: str,
                reference_fits: Mapping[str, Sequence[tuple[float, float]]]) -> str:
    """A page with, per seed, goodput and the global version over time for each mode,
    the faults marked (x is seconds since the schedule started, so both modes' faults
    fall at the same place), and each mode's final test loss (its last evaluation,
    run["evaluations"]) against the monotone fit of its mode's reference
    (`reference_fits`: mode -> (tokens, test loss))."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    parts = [f"<html><head><meta charset='utf-8'><title>{title}</title></head><body>",
             f"<h1>{title}</h1>"]
    colours = {"decoupled": "#1f77b4", "elastic": "#d62728", "elastic_warm": "#ff9896"}
    for n, (seed, runs) in enumerate(sorted(seeds.items())):
        fig = make_subplots(rows=3, cols=1, vertical_spacing=0.08,
                            subplot_titles=("goodput", "global version (outer steps)",
                                            "test loss against tokens merged"))
        for mode, run in runs.items():
            series = run["series"]
            x = [p["t"] - run["chaos_offset_s"] for p in series]
            fig.add_trace(go.Scatter(x=x, y=[p["goodput"] for p in series], name=mode,
                                     line={"color": colours.get(mode)}, legendgroup=mode),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=x, y=[p["outer_steps"] for p in series], name=mode,
                                     line={"color": colours.get(mode)}, legendgroup=mode,
                                     showlegend=False), row=2, col=1)
            tokens, windows = run["evaluations"][-1]
            fig.add_trace(go.Scatter(x=[tokens], y=[statistics.fmean(windows)], name=mode,
                                     mode="markers", legendgroup=mode,
                                     marker={"color": colours.get(mode), "size": 10},
                                     showlegend=False), row=3, col=1)
            fit = reference_fits[mode]
            fig.add_trace(go.Scatter(x=[t for t, _ in fit], y=[y for _, y in fit],
                                     name=f"{mode}'s reference (monotone fit)",
                                     legendgroup=mode, showlegend=n == 0,
                                     line={"color": colours.get(mode), "dash": "dot"}),
                          row=3, col=1)
        for fault in next(iter(runs.values()))["faults"]:
            fig.add_vrect(x0=fault["at_s"], x1=fault["at_s"] + fault["duration_s"],
                          fillcolor="orange", opacity=0.15, line_width=0,
                          annotation_text=fault["kind"], annotation_position="top left",
                          row=1, col=1)
            fig.add_vrect(x0=fault["at_s"], x1=fault["at_s"] + fault["duration_s"],
                          fillcolor="orange", opacity=0.15, line_width=0, row=2, col=1)
        fig.update_layout(title=f"seed {seed}", height=900)
        fig.update_xaxes(matches="x", row=2, col=1)
        fig.update_xaxes(title_text="seconds since the fault schedule started", row=2, col=1)
        fig.update_xaxes(title_text="tokens merged", type="log", row=3, col=1)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=n == 0))
    parts.append("</body></html>")
    return "\n".join(parts)
