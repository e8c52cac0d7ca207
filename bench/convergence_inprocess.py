"""Merge timing at equal tokens and time, in process: `python -m bench convergence --in-process`.

The quick workload of `bench convergence` (bench/convergence.py: 4 islands, H = 20,
P = 4, a 2-layer, 64-wide byte GPT) in the in-process cluster (diloco/cluster.py),
whose clock is virtual, so the machine's load moves the wall time and nothing else.
The islands run out of phase, at speeds 0.50, 0.46, 0.42 and 0.38 (a real run's
islands drift apart so). Four variants train the same token budget (mode sync's
merged tokens in convergence-quick.json), each on two seeds:

- sync: mode sync's settings (min_quorum = M, overlap_steps 0: every island waits);
- at_quorum: decoupled (K = 2 of 4, tau 1, the grace window) with
  sync.merge_each_period false: a round merges as soon as quorum and grace allow;
- each_period: the same with sync.merge_each_period true, the paper's rule: a round
  that reached its quorum merges once the islands expected within its fragment's
  synchronization period are in, with what arrived by then;
- each_period_close: each_period with the islands at nearly one pace (0.500, 0.497,
  0.494, 0.491), as a real run's islands of one speed are: the slowest closes each
  merge all of them reach and is due again a hair later than a median period after it
  (sync's loss at equal tokens does not depend on the speeds: every island waits).

It reports each variant's validation loss at the end (equal tokens), at the common
virtual time of the first three (the shortest run's end, read off each run's curve
between its evaluations), the virtual time, the pace (trained tokens and virtual time
at the last evaluation before the end), and merges per H window (merges per fragment
per round of H steps of every island's tokens). Checks, on the mean over the seeds of
each seed's ratio: each_period and each_period_close against sync at equal tokens, and
each_period against at_quorum at equal tokens and at equal time (the figures that
chose the default of sync.merge_each_period). Writes
bench/results/convergence-inprocess.json (--quick: the first seed alone, into
convergence-inprocess-quick.json).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from itertools import pairwise
from typing import Any

import torch

from bench import results
from bench.convergence import HOME, PROFILES, REGIONS, workload
from bench.goodput import make_corpus
from diloco.cluster import LocalResult, run_local
from diloco.config import RunConfig
from diloco.config_parse import parse_config
from syncd.environment import data_dir

SPEEDS = (0.50, 0.46, 0.42, 0.38)  # out of phase
CLOSE_SPEEDS = (0.500, 0.497, 0.494, 0.491)  # each_period_close: nearly one pace
TOKENS = 275_456  # mode sync's merged tokens in bench convergence --quick (convergence-quick.json)
SEEDS = (1234, 7)
EVAL_POINTS = 8
VARIANTS = ("sync", "at_quorum", "each_period", "each_period_close")
TIMED = VARIANTS[:3]  # the variants at the same speeds, compared at a common virtual time
BOUNDS = {"each_period_vs_sync_tokens": 1.01, "each_period_vs_at_quorum_tokens": 1.0,
          "each_period_vs_at_quorum_time": 1.0, "close_vs_sync_tokens": 1.01}


def variant_config(variant: str, corpus: str, seed: int) -> RunConfig:
    """The quick workload as `variant` runs it: out of phase, the budget, the seed."""
    data = workload(PROFILES["quick"], corpus, "sync" if variant == "sync" else "decoupled",
                    "none")
    data["seed"] = seed
    data["budget"] = {"total_tokens": TOKENS}
    speeds = CLOSE_SPEEDS if variant == "each_period_close" else SPEEDS
    for island, speed in zip(data["islands"], speeds, strict=True):
        island["speed"] = speed
    config = parse_config(data, list(REGIONS))
    if variant != "sync":
        config = replace(config, sync=replace(
            config.sync, merge_each_period=variant.startswith("each_period")))
    return config


def loss_at(curve: list[dict[str, Any]], when: float) -> float:
    """The loss at virtual time `when`, linear between the curve's evaluations (the first
    one's before it, the last one's after it)."""
    points = sorted((p["time"], p["eval_loss"]) for p in curve)
    if when <= points[0][0]:
        return points[0][1]
    for (t0, l0), (t1, l1) in pairwise(points):
        if t0 <= when <= t1:
            return l0 if t1 == t0 else l0 + (l1 - l0) * (when - t0) / (t1 - t0)
    return points[-1][1]


def merges_per_window(merges: int, fragments: int, tokens: int, round_tokens: int) -> float:
    """Merges of a fragment per round of H steps of every island's tokens (1 for sync)."""
    return merges / fragments / (tokens / round_tokens)


def figures(result: LocalResult, config: RunConfig) -> dict[str, Any]:
    return {"eval_loss": round(result.eval_loss, 4), "tokens": result.tokens,
            "tokens_merged": round(result.tokens_merged),
            "virtual_s": round(result.virtual_time_s, 1), "outer_steps": result.outer_steps,
            # (tokens, virtual s) at the last evaluation before the end: the pace of training
            "pace": [result.curve[-2]["tokens"], round(result.curve[-2]["time"], 1)],
            "merges_per_window": round(merges_per_window(
                result.merges, config.sync.fragments, result.tokens, config.round_tokens()), 3),
            "curve": [{k: round(p[k], 4) for k in ("tokens", "time", "eval_loss")}
                      for p in result.curve]}


def at_common_time(seed_runs: dict[str, dict[str, Any]]) -> float:
    """Adds the loss of each run of the TIMED variants at their common virtual time, in
    place; returns the time."""
    timed = [run for variant, run in seed_runs.items() if variant in TIMED]
    common = min(run["virtual_s"] for run in timed)
    for run in timed:
        run["eval_loss_at_time"] = round(loss_at(run["curve"], common), 4)
    return common


def ratios(seeds: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """The checks' ratios, each the mean over the seeds of that seed's ratio."""
    def mean(a: str, b: str, key: str) -> float:
        return statistics.mean(runs[a][key] / runs[b][key] for runs in seeds.values())

    return {"each_period_vs_sync_tokens": mean("each_period", "sync", "eval_loss"),
            "each_period_vs_at_quorum_tokens": mean("each_period", "at_quorum", "eval_loss"),
            "each_period_vs_at_quorum_time": mean("each_period", "at_quorum",
                                                  "eval_loss_at_time"),
            "at_quorum_vs_sync_tokens": mean("at_quorum", "sync", "eval_loss"),
            "at_quorum_vs_sync_time": mean("at_quorum", "sync", "eval_loss_at_time"),
            "each_period_vs_sync_time": mean("each_period", "sync", "eval_loss_at_time"),
            "close_vs_sync_tokens": mean("each_period_close", "sync", "eval_loss")}


def checks(ratio: dict[str, float]) -> dict[str, dict[str, Any]]:
    return {name: results.check(ratio[name], bound, at_least=False)
            for name, bound in BOUNDS.items()}


def main(quick: bool = False) -> int:
    torch.set_num_threads(1)  # a shared machine's cores: one thread each is faster
    os.environ["OMP_NUM_THREADS"] = "1"
    HOME.mkdir(parents=True, exist_ok=True)
    corpus = str(make_corpus(HOME / "corpus.txt"))
    seeds: dict[str, dict[str, dict[str, Any]]] = {}
    common: dict[str, float] = {}
    for seed in SEEDS[:1] if quick else SEEDS:
        runs = seeds.setdefault(str(seed), {})
        for variant in VARIANTS:
            config = variant_config(variant, corpus, seed)
            started = time.time()
            result = run_local(config, "decoupled", data_dir=data_dir(), eval_points=EVAL_POINTS)
            runs[variant] = figures(result, config)
            results.say(f"seed {seed} {variant}: loss {result.eval_loss:.4f}, "
                        f"{result.virtual_time_s:.0f} virtual s, {time.time() - started:.0f} s")
        common[str(seed)] = at_common_time(runs)
    ratio = {k: round(v, 4) for k, v in ratios(seeds).items()}
    record = {"profile": "in-process", "speeds": SPEEDS, "tokens": TOKENS,
              "common_virtual_s": common, "seeds": seeds, "ratios": ratio,
              "checks": checks(ratio)}
    out = results.write(f"convergence-inprocess{'-quick' if quick else ''}", record)
    rows = [{"seed": s, "variant": v, **{k: x for k, x in run.items() if k != "curve"}}
            for s, runs in seeds.items() for v, run in runs.items()]
    print(results.table(rows, ["seed", "variant", "eval_loss", "eval_loss_at_time",
                               "tokens_merged", "virtual_s", "merges_per_window"]))
    print(results.checks_table(record["checks"]))
    results.say(f"wrote {out}")
    return results.exit_code(record["checks"])
