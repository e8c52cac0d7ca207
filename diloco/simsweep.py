"""Sweeps of the datacenter simulator (diloco/sim.py): goodput, Archipelago's knobs, bandwidth.

`run_sweep(sweep)` is the one entry point: `python -m bench simulate` calls it
with the full sweep, a web page can call it with a small one. It returns plain
JSON-able values:

- goodput_table: data-parallel, elastic data-parallel and decoupled with each M,
  per chip count, in the paper's setting (SimConfig's defaults);
- knobs_table: decoupled at `knob_chips` and `knob_islands` with one of
  Archipelago's choices changed from that setting at a time, then all of them;
- bandwidth_table: compute utilization of a 12B model over 4 regions against the
  wide-area bandwidth, for data-parallel, DiLoCo, streaming and streaming int4.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from typing import Any

from diloco.sim import simulate, utilization
from diloco.simconfig import SimConfig

DEFAULT_SWEEP: dict[str, Any] = {
    "chips": [150_000, 1_200_000],
    "islands": [1, 8],
    "duration_s": 4 * 3600.0,
    "seed": 0,
    "base": {},  # SimConfig fields changed from the paper's setting for every run
    "knob_chips": 1_200_000,
    "knob_islands": 8,
    "knobs": True,
    "bandwidth_gbps": [0.5, 1.0, 2.0, 5.0, 10.0],
}

# Archipelago's own choices, each a change of one SimConfig field from the paper's setting.
KNOBS: dict[str, dict[str, Any]] = {
    # A returning slice loads the newest global in the background and joins the
    # running island at the next step instead of pausing it for a mesh rebuild.
    "reintegration": {"upscale_s": 1.0},
    # The adaptive grace window after quorum with t_sync the downlink alone (how
    # syncd/service.py sized it before its round_stats passed the round trip).
    "grace_window": {"grace_gamma": 1.0},
    # The same grace window with t_sync the round trip (uplink + downlink), as
    # syncd/service.py's round_stats passes it.
    "grace_window_round_trip": {"grace_gamma": 1.0, "grace_round_trip": True},
    # Smaller fragments: each send fits inside the overlap of tau steps.
    "fragments": {"fragments": 16},
}
ARCHIPELAGO = ("reintegration", "grace_window_round_trip", "fragments")

# The bandwidth study: a 12B model on 4 islands (one per region), no interruptions,
# every round waits for all 4 (K = M), as Streaming DiLoCo does.
BANDWIDTH_BASE: dict[str, Any] = {"chips": 4, "islands": 4, "min_quorum": 4,
                                  "model_params": 12e9, "step_time_s": 1.0,
                                  "inner_steps": 100, "latency_s": 0.05}
BANDWIDTH_MODES: dict[str, dict[str, Any]] = {
    "data_parallel": {"inner_steps": 1, "fragments": 1, "overlap_steps": 0,
                      "compression": "bf16"},
    "diloco": {"fragments": 1, "overlap_steps": 0, "compression": "bf16"},
    "streaming": {"fragments": 16, "overlap_steps": 5, "compression": "bf16"},
    "streaming_int4": {"fragments": 16, "overlap_steps": 5, "compression": "int4"},
}


def run_sweep(sweep: dict[str, Any], progress: Callable[[float], None] | None = None
              ) -> dict[str, Any]:
    """Run the sweep that `sweep` describes (keys of DEFAULT_SWEEP; missing ones take its values).

    `progress`, if given, is called with the fraction of runs done, from 0 to 1.
    """
    sweep = _check_sweep(sweep)
    base = {**sweep["base"], "duration_s": sweep["duration_s"], "seed": sweep["seed"]}
    goodput_runs = [({**base, "mode": m, "islands": 1, "chips": c}, None)
                    for c in sweep["chips"] for m in ("dp", "elastic")]
    goodput_runs += [({**base, "mode": "decoupled", "islands": n, "chips": c}, None)
                     for c in sweep["chips"] for n in sweep["islands"]]
    knob_base = {**base, "chips": sweep["knob_chips"], "islands": sweep["knob_islands"]}
    knob_runs = []
    if sweep["knobs"]:
        every = {k: v for name in ARCHIPELAGO for k, v in KNOBS[name].items()}
        knob_runs = [({**knob_base}, "paper")]
        knob_runs += [({**knob_base, **change}, name) for name, change in KNOBS.items()]
        knob_runs.append(({**knob_base, **every}, "archipelago"))
    bandwidth_runs = [(bw, mode) for mode in BANDWIDTH_MODES
                      for bw in sweep["bandwidth_gbps"]]
    total = len(goodput_runs) + len(knob_runs) + len(bandwidth_runs)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / total)

    goodput_table, knobs_table, bandwidth_table = [], [], []
    for changes, _ in goodput_runs:
        goodput_table.append(simulate(SimConfig(**changes)).row())
        tick()
    for changes, name in knob_runs:
        knobs_table.append({"knob": name, **simulate(SimConfig(**changes)).row()})
        tick()
    for bw, mode in bandwidth_runs:
        bandwidth_table.append({"mode": mode, "bandwidth_gbps": bw,
                                "utilization": bandwidth_utilization(mode, bw)})
        tick()
    return {"goodput_table": goodput_table, "knobs_table": knobs_table,
            "bandwidth_table": bandwidth_table, "sweep": sweep,
            "paper_setting": asdict(SimConfig(**base)),
            "knobs": {name: KNOBS[name] for name in KNOBS}, "archipelago": list(ARCHIPELAGO)}


def bandwidth_utilization(mode: str, bandwidth_gbps: float) -> float:
    """Compute utilization of the bandwidth study's `mode` at `bandwidth_gbps`."""
    if mode not in BANDWIDTH_MODES:
        raise ValueError(f"mode must be one of {', '.join(BANDWIDTH_MODES)}, got {mode!r}")
    config = SimConfig(**{**BANDWIDTH_BASE, **BANDWIDTH_MODES[mode],
                          "bandwidth_gbps": bandwidth_gbps, "duration_s": 1.0})
    # Long enough for 10 windows of H steps however slow the link makes them.
    window = config.inner_steps * config.step_time_s + 2 * config.fragments * (
        config.fragment_seconds + config.latency_s)
    return utilization(replace(config, duration_s=10 * window))


def bandwidth_needed(mode: str, target: float, low: float = 0.01, high: float = 1e5) -> float:
    """The least bandwidth (Gb/s, within 1%) at which `mode` reaches `target` utilization."""
    if bandwidth_utilization(mode, high) < target:
        return math.inf
    while high / low > 1.01:
        mid = math.sqrt(low * high)
        low, high = (mid, high) if bandwidth_utilization(mode, mid) < target else (low, mid)
    return high


def calibrate_reconfigure(target: float = 0.58, chips: int = 1_200_000,
                          duration_s: float = 86400.0, seed: int = 0) -> float:
    """The mesh rebuild pause (downscale = upscale) at which elastic data-parallel on
    `chips` reaches `target` goodput, to 0.01 s: how RECONFIGURE_S was fitted."""
    low, high = 0.0, 120.0
    while high - low > 0.01:
        mid = (low + high) / 2
        config = SimConfig(mode="elastic", islands=1, chips=chips, downscale_s=mid,
                           upscale_s=mid, duration_s=duration_s, seed=seed)
        low, high = (mid, high) if simulate(config).goodput > target else (low, mid)
    return round((low + high) / 2, 2)


def _check_sweep(sweep: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(sweep) - set(DEFAULT_SWEEP))
    if unknown:
        raise ValueError(f"unknown sweep keys {unknown}; known: {', '.join(DEFAULT_SWEEP)}")
    sweep = {**DEFAULT_SWEEP, **sweep}
    names = {f.name for f in fields(SimConfig)}
    bad = sorted(set(sweep["base"]) - names)
    if bad:
        raise ValueError(f"base sets unknown SimConfig fields {bad}")
    for key in ("chips", "islands", "bandwidth_gbps"):
        if not isinstance(sweep[key], list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                for v in sweep[key]):
            raise ValueError(f"{key} must be a list of positive numbers, got {sweep[key]!r}")
    return sweep

