"""What `python -m bench convergence` reports from its runs: pure functions of the
curves and merges each run left (bench/convergence.py makes them), so that they are
tested without a system.

A run's curve is its checkpoints, each as {t, tokens, loss}: seconds since every
island trained, tokens merged, and the held-out loss on the curve's batches.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from bench import results
from diloco.staleness import summary as ages_summary

TARGET_ABOVE_SYNC = 1.05  # the target loss: 1.05 x sync's fault-free loss
KILLS_SOONER = 1.3  # under kills, decoupled reaches the target at least this much sooner


def at_time(curve: Sequence[dict[str, float]], t: float) -> dict[str, float] | None:
    """The newest point of the curve at or before `t`; None if none is."""
    before = [p for p in curve if p["t"] <= t]
    return before[-1] if before else None


def loss_at_tokens(curve: Sequence[dict[str, float]], tokens: float) -> float | None:
    """The curve's loss at `tokens` merged, linear between its two points around it;
    None outside the tokens it covers."""
    ordered = sorted(curve, key=lambda p: p["tokens"])
    for a, b in pairwise(ordered):
        if a["tokens"] <= tokens <= b["tokens"]:
            span = b["tokens"] - a["tokens"]
            share = (tokens - a["tokens"]) / span if span else 1.0
            return a["loss"] + share * (b["loss"] - a["loss"])
    if ordered and ordered[-1]["tokens"] == tokens:
        return ordered[-1]["loss"]
    return None


def time_to_target(curve: Sequence[dict[str, float]], target: float) -> float | None:
    """The first time the curve's loss is at most `target`; None if it never is."""
    return next((p["t"] for p in curve if p["loss"] <= target), None)


def merges_per_window(merges: Sequence[dict[str, Any]], fragments: int, h: int) -> float | None:
    """Merges of a fragment per H inner steps of a typical island: the merges over the
    fragments, over the median island's inner steps (its newest merged seq) / H. 1 when
    every merge waits for every island; about M / K when K of M merge as they come."""
    newest: dict[str, int] = {}
    for merge in merges:
        for island, seq in merge.get("seqs", {}).items():
            newest[island] = max(seq, newest.get(island, 0))
    if not newest or not merges:
        return None
    windows = statistics.median(newest.values()) / h
    return round(len(merges) / fragments / windows, 3) if windows else None


def staleness(merges: Sequence[dict[str, Any]]) -> dict[str, float]:
    """p50, p95 and max of the ages of every update merged (diloco/staleness.py)."""
    return ages_summary([age for merge in merges for age in merge.get("ages", {}).values()])


def figures(run: dict[str, Any], common_s: float, fragments: int, h: int) -> dict[str, Any]:
    """One run's figures at the common wall time (the final loss is `run["final"]`, its
    checkpoint at that time evaluated on the final batches)."""
    point = at_time(run["curve"], common_s) or {"tokens": 0, "loss": None}
    ages = staleness(run["merges"])
    versions: dict[int, int] = {}
    for merge in run["merges"]:
        versions[merge["fragment"]] = max(merge["version"], versions.get(merge["fragment"], 0))
    return {"eval_loss": run.get("final"), "tokens": point["tokens"],
            "outer_steps": min(versions.values()) if len(versions) == fragments else 0,
            "merges_per_window": merges_per_window(run["merges"], fragments, h),
            "staleness_p50": ages["p50"], "staleness_p95": ages["p95"],
            "staleness_max": ages["max"], "end_s": run["end_s"],
            "kills": run["kills"], "load": run.get("load"), "waited_s": run.get("waited_s"),
            "curve": run["curve"]}


def finish(modes: dict[str, dict[str, dict[str, Any]]]) -> float | None:
    """Per case, each mode's loss at sync's merged tokens (`eval_loss_at_tokens`, on the
    curve's batches, as sync's own) and the time to the target, in place; returns the
    target: 1.05 x sync's fault-free loss (None without that run)."""
    sync = modes.get("sync", {})
    target = None
    if sync.get("none", {}).get("eval_loss") is not None:
        target = TARGET_ABOVE_SYNC * sync["none"]["eval_loss"]
    for cases in modes.values():
        for case, row in cases.items():
            sync_tokens = sync.get(case, {}).get("tokens")
            at_tokens = loss_at_tokens(row["curve"], sync_tokens) if sync_tokens else None
            row["eval_loss_at_tokens"] = None if at_tokens is None else round(at_tokens, 4)
            row["time_to_target_s"] = (time_to_target(row["curve"], target)
                                       if target is not None else None)
    return None if target is None else round(target, 4)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def checks(modes: dict[str, dict[str, dict[str, Any]]], bounds: dict[str, float]
           ) -> dict[str, dict[str, Any]]:
    """The checks of the cases run: decoupled against sync (a missing figure is a miss)."""
    d, s = modes.get("decoupled", {}), modes.get("sync", {})
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, value: float | None, bound: float, **extra: Any) -> None:
        if value is None:
            out[name] = {"value": None, "bound": f"<= {bound}", "ok": False, **extra}
        else:
            out[name] = {**results.check(value, bound, at_least=False), **extra}

    if "none" in d and "none" in s:
        add("loss_equal_time", ratio(d["none"]["eval_loss"], s["none"]["eval_loss"]),
            bounds["time"])
        add("loss_equal_tokens", ratio(d["none"]["eval_loss_at_tokens"],
                                       s["none"]["eval_loss_at_tokens"]), bounds["tokens"])
        kills, at_most = None, False
        if "kills" in d and "kills" in s:
            kills = ratio(d["kills"]["time_to_target_s"], s["kills"]["time_to_target_s"])
            if kills is None and d["kills"]["time_to_target_s"] is not None:
                # sync never reached the target: its time is past its run's end, so the
                # ratio is below decoupled's time over that end (kills_at_most)
                kills = ratio(d["kills"]["time_to_target_s"], s["kills"]["end_s"])
                at_most = kills is not None
        sooner = round(1 / KILLS_SOONER, 4)
        add("time_to_target", ratio(d["none"]["time_to_target_s"],
                                    s["none"]["time_to_target_s"]), 1.0,
            kills_value=None if kills is None else round(kills, 4), kills_at_most=at_most)
        if "kills" in d and "kills" in s:
            # fault-free no later than sync, and under kills at least 1.3x sooner
            held = out["time_to_target"]["ok"] and kills is not None and kills <= sooner
            out["time_to_target"].update(bound=f"<= 1.0, kills <= {sooner}", ok=held)
    for case, name in (("kills", "kills_lower"), ("straggle", "straggle_lower")):
        if case in d and case in s:
            # below 1: decoupled's loss lower than sync's at the same wall time
            add(name, ratio(d[case]["eval_loss"], s[case]["eval_loss"]), bounds["lower"])
    return out


def figure_html(modes: dict[str, dict[str, dict[str, Any]]], title: str) -> str:
    """Per case, held-out loss against wall time and against tokens merged, a line per mode."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    colours = {"decoupled": "#1f77b4", "decoupled_all": "#9467bd", "sync": "#2ca02c",
               "dp": "#d62728"}
    cases = sorted({case for runs in modes.values() for case in runs})
    parts = [f"<html><head><meta charset='utf-8'><title>{title}</title></head><body>",
             f"<h1>{title}</h1>"]
    for n, case in enumerate(cases):
        fig = make_subplots(rows=1, cols=2, subplot_titles=(
            "held-out loss against wall time (s)", "held-out loss against tokens merged"))
        for mode, runs in modes.items():
            if case not in runs:
                continue
            curve = runs[case]["curve"]
            style = {"color": colours.get(mode)}
            fig.add_trace(go.Scatter(x=[p["t"] for p in curve], y=[p["loss"] for p in curve],
                                     name=mode, line=style, legendgroup=mode), row=1, col=1)
            fig.add_trace(go.Scatter(x=[p["tokens"] for p in curve],
                                     y=[p["loss"] for p in curve], name=mode, line=style,
                                     legendgroup=mode, showlegend=False), row=1, col=2)
        fig.update_layout(title=f"case {case}", height=450)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=n == 0))
    parts.append("</body></html>")
    return "\n".join(parts)
