"""Quality at equal tokens: data-parallel, plain DiLoCo, Decoupled DiLoCo, and int4.

`python -m bench quality` trains the same model on the default corpus to the
same token budget in four ways, side by side in one run, over two seeds:

- dp: one model, global batch = all islands' batches, fp32 ring all-reduce
  of the gradient every step, at the learning rate its sweep chose (below);
- diloco_sync: plain DiLoCo, unfragmented, every island merges every H steps
  with equal weights;
- decoupled: 4 islands of speeds 1.0, 1.0, 0.7, 0.5 and batch sizes 12, 8, 8, 4,
  min_quorum 2, grace on, token weights, 4 fragments;
- decoupled_int4: the same with int4 updates up and int4 deltas down.

First a sweep of data-parallel's learning rate (seed 0; factors of 2, extended
past an end while that end is best), judged on the validation split, so that the
baseline gets the care the DiLoCo settings got; the value of the lowest
validation loss is the one reported. Then a sweep over H for
decoupled and decoupled_int4 (eval loss against bytes per token).

`python -m bench quality --preset NAME` checks a preset's own codecs at its own size
instead (item 9 of the data-plane issue: gpt2_small is 85M parameters, the full
profile 185K): the preset's config as the form gives it, trained in this process
on train.device ("auto": a GPU when the host has one), once with float32 both ways
and once with the preset's codecs, from the same seeds to the same tokens. It
writes bench/results/quality-preset-NAME.json after each run, so a cut-off run
keeps what it measured, and exits non-zero if the preset's codecs lose more than
the full profile's int4 bound (1.01 x the eval loss).

Every reported eval loss is the final model's on the test split, which neither
the sweep nor any earlier tuning read (diloco/data.py); the validation loss, what
the runs watched and the sweep compared, is reported beside it. It writes
bench/results/quality.json and prints a table, and exits non-zero if a relation
the issue asks for does not hold.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from bench import results
from diloco.cluster import LocalResult, run_local
from diloco.config import RunConfig
from diloco.config_parse import parse_config
from diloco.data import load_corpus
from diloco.device import resolve_device
from diloco.evaluation import Evaluator
from diloco.presets import PRESETS
from syncd.environment import data_dir

ISLANDS = [("fast-a", 12, 1.0), ("fast-b", 8, 1.0), ("mid", 8, 0.7), ("slow", 4, 0.5)]

# Full run: about 25 minutes on 2 idle cores. Quick run: about 2 minutes.
# dp_lrs: data-parallel's sweep, factors of 2 around the 2e-3 every mode used before,
# extended past an end that is best, up to dp_max_runs runs (dp_lr_sweep).
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"model": {"n_layer": 3, "n_embd": 64, "n_head": 4, "block_size": 64},
             "tokens": 3_000_000, "inner_steps": 50, "warmup": 100, "eval_tokens": 65536,
             "seeds": [0, 1], "sweep": [10, 25, 50, 100], "dp_lrs": [1e-3, 2e-3, 4e-3],
             "dp_max_runs": 5,
             "bounds": {"decoupled_vs_sync": 1.02, "sync_vs_dp": 1.05, "int4_vs_decoupled": 1.01,
                        "bytes_ratio": 300.0, "peak_ratio": 1.25}},
    "quick": {"model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64},
              "tokens": 600_000, "inner_steps": 50, "warmup": 50, "eval_tokens": 16384,
              "seeds": [0], "sweep": [25, 50], "dp_lrs": [1e-3, 2e-3, 4e-3],
              "dp_max_runs": 5,
              "bounds": {"decoupled_vs_sync": 1.05, "sync_vs_dp": 1.10, "int4_vs_decoupled": 1.03,
                         "bytes_ratio": 100.0, "peak_ratio": 1.25}},
}
MAIN = ("dp", "diloco_sync", "decoupled", "decoupled_int4")
# The preset check: tokens per run (what one GPU lease affords at 85M) and seeds.
PRESET_PROFILES: dict[str, dict[str, Any]] = {
    "full": {"tokens": 2_000_000, "seeds": [0, 1], "eval_points": 4},
    "quick": {"tokens": 100_000, "seeds": [0], "eval_points": 2},
}


def make_config(profile: dict[str, Any], seed: int, inner_steps: int, codec: str = "none",
                fragments: int = 4, inner_lr: float = 2e-3) -> RunConfig:
    data = {
        "seed": seed,
        "model": profile["model"],
        "data": {"path": profile.get("data_path", "")},
        "sync": {"inner_steps": inner_steps, "fragments": fragments,
                 "overlap_steps": max(1, inner_steps // 20), "alpha": 0.0, "min_quorum": 2,
                 "grace_gamma": 1.0, "weighting": "tokens", "compression": codec,
                 "downlink_compression": codec, "max_staleness": 8},
        "optim": {"inner_lr": inner_lr, "outer_lr": 0.8, "outer_momentum": 0.8,
                  "weight_decay": 0.1, "warmup_steps": profile["warmup"]},
        "eval": {"tokens": profile["eval_tokens"]},
        "budget": {"total_tokens": profile["tokens"]},
        "islands": [{"name": n, "region": "us-east", "batch_size": b, "speed": s}
                    for n, b, s in ISLANDS],
    }
    return parse_config(data, ["us-east"])


def run_one(label: str, config: RunConfig, mode: str, window_steps: int) -> LocalResult:
    started = time.time()

    def progress(point: dict) -> None:
        results.say(f"  {label}: {point['tokens']:>9,} tokens  validation loss "
                    f"{point['eval_loss']:.4f}  ({time.time() - started:.0f} s)")

    result = run_local(config, mode, data_dir=data_dir(), window_steps=window_steps,
                       progress=progress)
    results.say(f"{label}: validation loss {result.eval_loss:.4f}, {result.bytes_sent:,} bytes, "
                f"{time.time() - started:.0f} s")
    return result


def reported_loss(config: RunConfig, result: LocalResult) -> float:
    """The reported figure: the run's final model on the test split, which no tuning
    read (the run itself evaluated on validation)."""
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    return Evaluator(config, corpus, "test", resolve_device(config.train.device))(result.params)


def chosen_lr(sweep: list[dict[str, Any]]) -> float:
    """The swept learning rate of the lowest validation loss. The test split is never
    looked at to choose."""
    return min(sweep, key=lambda row: row["validation_loss"])["inner_lr"]


def dp_lr_sweep(profile: dict[str, Any], window: int
                ) -> tuple[list[dict[str, Any]], dict[float, LocalResult]]:
    """Data-parallel at each of the profile's learning rates, seed 0, and at one more
    factor of 2 past an end for as long as the best is at that end (at most
    dp_max_runs runs), so that the rate chosen is a minimum, not the sweep's edge.
    Returns the sweep's rows (validation loss only), by rate, and the runs by rate."""
    seed, h = profile["seeds"][0], profile["inner_steps"]
    runs: dict[float, LocalResult] = {}
    todo = list(profile["dp_lrs"])
    while todo:
        lr = todo.pop(0)
        runs[lr] = run_one(f"dp lr={lr:g}", make_config(profile, seed, h, inner_lr=lr), "dp",
                           window)
        best = min(runs, key=lambda k: runs[k].eval_loss)
        if not todo and len(runs) < profile["dp_max_runs"]:
            if best == max(runs):
                todo.append(best * 2)
            elif best == min(runs):
                todo.append(best / 2)
    return [{"inner_lr": lr, "validation_loss": runs[lr].eval_loss} for lr in sorted(runs)], runs


def summary(runs: list[LocalResult], tests: list[float]) -> dict[str, Any]:
    first = runs[0]
    validation = [r.eval_loss for r in runs]
    return {"eval_loss": statistics.fmean(tests), "eval_loss_seeds": tests,
            "eval_loss_spread": max(tests) - min(tests),
            "validation_loss": statistics.fmean(validation),
            "validation_loss_seeds": validation, "tokens": first.tokens,
            "tokens_merged": first.tokens_merged, "bytes_sent": first.bytes_sent,
            "bytes_per_token": first.bytes_sent / first.tokens,
            "peak_bytes_per_window": first.peak_bytes_per_window,
            "peak_down_bytes_per_window": first.peak_down_bytes_per_window,
            "outer_steps": first.outer_steps, "merges": first.merges}


def preset_run_config(name: str, seed: int, tokens: int, lossless: bool) -> RunConfig:
    """Preset `name`'s config in its own regions, from `seed` to `tokens`, with its own
    codecs, or with float32 both ways when `lossless`.

    Raises:
        KeyError: for an unknown preset.
    """
    data = copy.deepcopy(PRESETS[name][1])
    if lossless:
        data["sync"] = {**data.get("sync", {}), "compression": "none",
                        "downlink_compression": "none"}
    data.update(seed=seed, budget={"total_tokens": tokens})
    regions = list(dict.fromkeys(island["region"] for island in data["islands"]))
    return parse_config(data, regions)


def main_preset(name: str, quick: bool = False) -> int:
    """Preset `name`'s codecs against float32 both ways, at the preset's size."""
    if name not in PRESETS:
        raise SystemExit(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
    profile = PRESET_PROFILES["quick" if quick else "full"]
    started = time.time()
    own = preset_run_config(name, 0, profile["tokens"], lossless=False)
    codecs = f"{own.sync.compression} up, {own.sync.downlink_compression} down"
    device = resolve_device(own.train.device)
    out: dict[str, Any] = {"preset": name, "profile": "quick" if quick else "full",
                           "codecs": codecs, "device": device,
                           "device_name": (torch.cuda.get_device_name(device)
                                           if device.startswith("cuda") else "cpu"),
                           "settings": profile, "runs": []}
    for seed in profile["seeds"]:
        for lossless in (True, False):
            config = preset_run_config(name, seed, profile["tokens"], lossless)
            label = f"{name} seed {seed} {'float32' if lossless else codecs}"
            run_started = time.time()
            result = run_local(config, "decoupled", data_dir=data_dir(),
                               eval_points=profile["eval_points"],
                               progress=lambda point, label=label: results.say(
                                   f"  {label}: {point['tokens']:>9,} tokens  validation loss "
                                   f"{point['eval_loss']:.4f}"))
            seconds = time.time() - run_started
            out["runs"].append({
                "seed": seed, "codecs": "none" if lossless else codecs,
                "eval_loss": reported_loss(config, result), "validation_loss": result.eval_loss,
                "tokens": result.tokens, "bytes_per_token": result.bytes_sent / result.tokens,
                "merges": result.merges, "seconds": round(seconds, 1),
                "tokens_per_s": round(result.tokens / seconds)})
            out["model_params"] = result.model_params
            results.say(f"{label}: test loss {out['runs'][-1]['eval_loss']:.4f}, "
                        f"{seconds:.0f} s")
            out["seconds"] = round(time.time() - started, 1)
            results.write(f"quality-preset-{name}", out)  # what a cut-off run keeps

    def mean_loss(lossless: bool) -> float:
        return statistics.fmean(r["eval_loss"] for r in out["runs"]
                                if (r["codecs"] == "none") == lossless)

    fp32 = [r["eval_loss"] for r in out["runs"] if r["codecs"] == "none"]
    out["float32_seed_spread"] = max(fp32) - min(fp32)
    out["checks"] = {f"{codecs} / float32 eval loss": results.check(
        mean_loss(False) / mean_loss(True), PROFILES["full"]["bounds"]["int4_vs_decoupled"],
        at_least=False)}
    path = results.write(f"quality-preset-{name}", out)
    print(results.table(out["runs"], ["seed", "codecs", "eval_loss", "validation_loss",
                                      "bytes_per_token", "tokens_per_s"]))
    print()
    print(results.checks_table(out["checks"]))
    print(f"\nmodel: {out['model_params']:,} parameters on {out['device_name']}; "
          f"{out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])


def main(quick: bool = False, preset: str | None = None) -> int:
    if preset is not None:
        return main_preset(preset, quick)
    profile = PROFILES["quick" if quick else "full"]
    started = time.time()
    h = profile["inner_steps"]
    window = h // 4  # a sync window of the fragmented runs: H/P inner steps
    results.say(f"data-parallel learning rates {profile['dp_lrs']}, seed {profile['seeds'][0]}")
    dp_sweep, dp_runs = dp_lr_sweep(profile, window)
    dp_lr = chosen_lr(dp_sweep)
    runs: dict[str, list[LocalResult]] = {k: [] for k in MAIN}
    tests: dict[str, list[float]] = {k: [] for k in MAIN}

    def reported(key: str, config: RunConfig, result: LocalResult) -> None:
        runs[key].append(result)
        tests[key].append(reported_loss(config, result))

    for seed in profile["seeds"]:
        base = make_config(profile, seed, h)
        results.say(f"seed {seed}")
        dp_config = make_config(profile, seed, h, inner_lr=dp_lr)
        # Seed 0's run at the chosen rate is the sweep's: the same run, not run again.
        reported("dp", dp_config, dp_runs[dp_lr] if seed == profile["seeds"][0]
                 else run_one("dp", dp_config, "dp", window))
        unfragmented = replace(base, sync=replace(base.sync, fragments=1))
        reported("diloco_sync", unfragmented, run_one("diloco_sync", unfragmented, "sync",
                                                      window))
        reported("decoupled", base, run_one("decoupled", base, "decoupled", window))
        int4 = make_config(profile, seed, h, codec="int4")
        reported("decoupled_int4", int4, run_one("decoupled_int4", int4, "decoupled", window))
    out: dict[str, Any] = {name: summary(rs, tests[name]) for name, rs in runs.items()}
    out["splits"] = {"reported": "test", "tuning": "validation"}
    out["dp_lr_sweep"] = {"seed": profile["seeds"][0], "rows": dp_sweep, "chosen": dp_lr}
    out["model_params"] = runs["dp"][0].model_params

    sweep = []
    for inner_steps in profile["sweep"]:
        for codec, key in (("none", "decoupled"), ("int4", "decoupled_int4")):
            if inner_steps == h:
                r, test = runs[key][0], tests[key][0]
            else:
                config = make_config(profile, profile["seeds"][0], inner_steps, codec)
                r = run_one(f"{key} H={inner_steps}", config, "decoupled",
                            max(1, inner_steps // 4))
                test = reported_loss(config, r)
            sweep.append({"inner_steps": inner_steps, "compression": codec,
                          "eval_loss": test, "validation_loss": r.eval_loss,
                          "bytes_per_token": r.bytes_sent / r.tokens})
    out["h_sweep"] = sweep
    out["checks"] = checks(out, profile["bounds"])
    out["profile"] = "quick" if quick else "full"
    out["settings"] = {k: v for k, v in profile.items() if k != "bounds"}
    out["seconds"] = round(time.time() - started, 1)
    # A quick run keeps its own file, so it never hides the figures of the full one.
    path = results.write("quality-quick" if quick else "quality", out)

    print(results.table(dp_sweep, ["inner_lr", "validation_loss"]))
    print(f"data-parallel's learning rate: {dp_lr:g} (the lowest validation loss)\n")
    columns = ["eval_loss", "eval_loss_spread", "validation_loss", "tokens", "bytes_per_token",
               "peak_bytes_per_window"]
    print("eval_loss: the test split; validation_loss: what the runs watched")
    print(results.table([{"run": k, **{c: out[k][c] for c in columns}} for k in MAIN],
                        ["run", *columns]))
    print()
    print(results.table(sweep, ["inner_steps", "compression", "eval_loss", "validation_loss",
                                "bytes_per_token"]))
    print()
    print(results.checks_table(out["checks"]))
    print(f"\nmodel: {out['model_params']:,} parameters; {out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])


def checks(out: dict[str, Any], bounds: dict[str, float]) -> dict[str, dict[str, Any]]:
    """The relations the issue asks for, with this profile's bounds."""
    def loss(k: str) -> float:
        return out[k]["eval_loss"]

    def per_token(k: str) -> float:
        return out[k]["bytes_per_token"]

    rows = {
        "decoupled / diloco_sync eval loss": (loss("decoupled") / loss("diloco_sync"),
                                              bounds["decoupled_vs_sync"], "<="),
        "diloco_sync / dp eval loss": (loss("diloco_sync") / loss("dp"), bounds["sync_vs_dp"],
                                       "<="),
        "decoupled_int4 / decoupled eval loss": (loss("decoupled_int4") / loss("decoupled"),
                                                 bounds["int4_vs_decoupled"], "<="),
        "dp / decoupled_int4 bytes per token": (per_token("dp") / per_token("decoupled_int4"),
                                                bounds["bytes_ratio"], ">="),
        "decoupled / diloco_sync peak uplink bytes per window x P": (
            4 * out["decoupled"]["peak_bytes_per_window"]
            / out["diloco_sync"]["peak_bytes_per_window"], bounds["peak_ratio"], "<="),
    }
    return {name: results.check(v, b, at_least=op == ">=") for name, (v, b, op) in rows.items()}
