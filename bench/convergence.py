"""Learning per token on the real system: `python -m bench convergence [--quick]`.

It starts Archipelago as `python -m webapp.start` does (bench/system.py: a Redis and
a data plane of its own, SQLite, syncd, a Celery worker per region; state under
var/bench-convergence) and trains the same workload (4 islands in 2 regions) in each
mode for the same wall time, one run after another:

- decoupled: the config's defaults (K = 2 of 4, tau 1 or 0 as syncd chooses from the
  run's pace, the grace window);
- decoupled_all: the same with K = M;
- sync: run mode sync, synchronous DiLoCo (every alive island in each merge, which
  every island waits for: diloco.config.synchronous);
- dp: run mode elastic, the data-parallel baseline;
- decoupled_tau0 (only when asked for, `--modes`): the defaults with overlap_steps 0,
  each island waiting for the merge of its own update (K = 2 of 4 still): what the
  overlap alone costs;
- decoupled_alpha (only when asked for): the defaults with alpha 0.5, the mix of Streaming
  DiLoCo (arXiv 2501.18512), half the island's own fragment and half the global;

each fault-free (none), under a seeded kill schedule (kills: SIGKILL of an island
every 30 +- 3 s through the run services, back after 10 s, one island at a time, so
never fewer than K = 2 alive; the same schedule for every mode) and with one island
at half speed (straggle). A run's clock starts when all its islands train and it is
stopped after the profile's wall time. Every checkpoint (one each CHECKPOINT_S) is
evaluated afterwards, outside the run's budget, on the config's test split (the same
windows for every run): the curve on `curve_batches` batches of 16 windows, and the
checkpoint at the common wall time (the end of the shortest run) on
`final_batches`. The merges' events give the outer steps, merges per H window and
the age of each merged update (diloco/staleness.py); the run's status, read each
second, the seconds its islands waited for each merge (`waited_s`, tau 0). The figures
and checks are bench/convergence_report.py's; it writes bench/results/convergence.json
(convergence-quick.json with --quick) and an HTML report of the curves beside it.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import convergence_report as report
from bench import results
from bench.goodput import make_corpus
from bench.system import ROOT, BenchSystem
from diloco.config import SyncConfig
from syncd.environment import data_dir

HOME = ROOT / "var" / "bench-convergence"
REGIONS = ("us-east", "us-west")
MODES = {"decoupled": "decoupled", "decoupled_all": "decoupled", "sync": "sync", "dp": "elastic",
         "decoupled_tau0": "decoupled", "decoupled_alpha": "decoupled"}
CASES = ("none", "kills", "straggle")
EVAL_BATCH = 16  # windows per held-out batch
KILL_EVERY_S, KILL_JITTER_S, KILL_DOWN_S = 30.0, 3.0, 10.0
PROFILES: dict[str, dict[str, Any]] = {
    # The workload of issue 46: a 4-layer, 128-wide byte GPT, batch 8 x 128, H = 20.
    "full": {"modes": ("decoupled", "decoupled_all", "sync", "dp"), "cases": CASES,
             "wall_s": 240.0, "curve_batches": 10, "final_batches": 40, "checkpoint_s": 10.0,
             "corpus": "stdlib",
             "model": {"n_layer": 4, "n_embd": 128, "n_head": 4, "block_size": 128},
             "speed": 1.0, "bounds": {"time": 1.02, "tokens": 1.01, "lower": 1.0}},
    "quick": {"modes": ("decoupled", "sync"), "cases": ("none", "kills"), "wall_s": 60.0,
              "curve_batches": 5, "final_batches": 20, "checkpoint_s": 4.0, "corpus": "small",
              "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64},
              "speed": 0.5, "bounds": {"time": 1.05, "tokens": 1.03, "lower": 1.0}},
}
SEED = 1234
STOP_TIMEOUT_S = 180.0


def workload(profile: dict[str, Any], corpus: str, mode: str, case: str) -> dict[str, Any]:
    """The run config of one mode and case: the same workload, the mode's settings."""
    islands = [{"name": f"{region.split('-')[1]}-{i}", "region": region, "batch_size": 8,
                "speed": profile["speed"]} for region in REGIONS for i in range(2)]
    if case == "straggle":
        islands[-1]["speed"] = profile["speed"] / 2
    config = {
        "seed": SEED, "model": profile["model"], "data": {"path": corpus},
        "sync": {"inner_steps": 20, "min_quorum": 4 if mode == "decoupled_all" else 2},
        "optim": {"inner_lr": 1e-3, "outer_lr": 0.7, "outer_momentum": 0.9},
        "liveness": {"heartbeat_timeout_s": 5.0},
        "checkpoint": {"interval_s": profile["checkpoint_s"], "keep": 1000},
        "budget": {"total_tokens": 10**12},
        "islands": islands,
    }
    if mode == "sync":
        config["sync"].update(min_quorum=len(islands), overlap_steps=0)
    if mode == "decoupled_tau0":
        config["sync"].update(overlap_steps=0)
    if mode == "decoupled_alpha":
        config["sync"].update(alpha=0.5)
    return config


def kill_schedule(seed: int, wall_s: float, islands: list[str]) -> list[tuple[float, str]]:
    """(seconds after all train, island) of each kill: every 30 +- 3 s, seeded; each is
    back 10 s later, before the next, so never more than one is down."""
    rng = random.Random(seed)
    at, out = 0.0, []
    while True:
        at += KILL_EVERY_S + rng.uniform(-KILL_JITTER_S, KILL_JITTER_S)
        if at >= wall_s:
            return out
        out.append((round(at, 2), rng.choice(islands)))


def all_training(status: dict[str, Any], names: list[str]) -> bool:
    islands = status.get("islands", {})
    return all(islands.get(n, {}).get("state") == "training" for n in names)


def run_once(system: BenchSystem, profile: dict[str, Any], mode: str, case: str,
             corpus: str) -> dict[str, Any]:
    """Train one mode and case for the profile's wall time, then stop it; its merges,
    its checkpoints' times and the kills done."""
    from syncd.connection import connect
    from syncd.store import RunStore
    from webapp.processes import wait_for
    from webapp.runs.faults import kill_island
    from webapp.runs.lifecycle import create_run, start_run, stop_run
    from webapp.runs.membership import rejoin_island
    from webapp.runs.models import Run

    config = workload(profile, corpus, mode, case)
    names = [i["name"] for i in config["islands"]]
    run = create_run(name=f"{mode} {case}", mode=MODES[mode], config=config, user=None)
    store = RunStore(connect(system.redis_url), run.pk)
    results.say(f"{mode} / {case}: run {run.pk}")
    start_run(run, by=None)

    def started() -> bool:
        died = system.processes.check()
        if died:
            raise RuntimeError("; ".join(died))
        return all_training(store.status() or {}, names)

    wait_for(started, 300.0, f"the islands of {mode} / {case} training", 0.2)
    t0 = time.time()
    load = os.getloadavg()[0]
    kills = kill_schedule(SEED, profile["wall_s"], names) if case == "kills" else []
    back: list[tuple[float, str]] = []
    done, waited, looked = 0, 0.0, 0.0  # waited: seconds syncd had the islands wait (tau 0)
    while (now := time.time() - t0) < profile["wall_s"]:
        if now - looked >= 1.0:
            waited += (now - looked) if (store.status() or {}).get("tau") == 0 else 0.0
            looked = now
        if done < len(kills) and now >= kills[done][0]:
            kill_island(run, kills[done][1], by=None)
            back.append((kills[done][0] + KILL_DOWN_S, kills[done][1]))
            done += 1
        for at, island in [b for b in back if now >= b[0]]:
            rejoin_island(Run.objects.get(pk=run.pk), island, by=None)
            back.remove((at, island))
        died = system.processes.check()
        if died:
            raise RuntimeError("; ".join(died))
        time.sleep(0.1)
    stop_run(run, by=None)
    wait_for(lambda: Run.objects.get(pk=run.pk).state in (Run.State.STOPPED, Run.State.FAILED),
             STOP_TIMEOUT_S, f"{mode} / {case} stopped", 0.5)
    merges = [e.detail for e in run.events.filter(kind="merge").order_by("time", "id")]
    checkpoints = [(row.created_at.timestamp() - t0, row.path, row.sha256)
                   for row in run.checkpoints.order_by("created_at", "id")]
    return {"run": run.pk, "config": config, "merges": merges, "checkpoints": checkpoints,
            "kills": done, "load": round(load, 2), "waited_s": round(waited, 1)}


def evaluate(profile: dict[str, Any], runs: dict[str, dict[str, Any]]) -> float:
    """Every run's curve on the curve's batches and its checkpoint at the common wall time
    on the final batches, in place (outside the runs' budget); returns the common time."""
    from diloco.config_parse import parse_config
    from diloco.data import load_corpus
    from diloco.evaluation import Evaluator
    from syncd import checkpoint

    any_config = parse_config(next(iter(runs.values()))["config"], list(REGIONS))
    data = load_corpus(any_config.data.path, any_config.data.eval_fraction, data_dir())
    block = any_config.model.block_size

    def evaluator(batches: int) -> Evaluator:
        tokens = batches * EVAL_BATCH * block
        return Evaluator(replace(any_config, eval=replace(any_config.eval, tokens=tokens)),
                         data, "test")

    curve_eval = evaluator(profile["curve_batches"])
    final_eval = evaluator(profile["final_batches"])
    for run in runs.values():
        run["curve"] = []
        for t, path, sha in run["checkpoints"]:
            params, _, _, tokens = checkpoint.load(Path(path), sha)
            run["curve"].append({"t": round(t, 2), "tokens": tokens,
                                 "loss": round(curve_eval(params), 4)})
        run["end_s"] = run["curve"][-1]["t"] if run["curve"] else 0.0
    common = min(run["end_s"] for run in runs.values())
    for run in runs.values():
        chosen = [c for c in run["checkpoints"] if c[0] <= common + 1e-6]
        if chosen:
            params = checkpoint.load(Path(chosen[-1][1]), chosen[-1][2])[0]
            run["final"] = round(final_eval(params), 4)
    return common


def main(quick: bool = False, modes: tuple[str, ...] = (), cases: tuple[str, ...] = ()) -> int:
    """The profile's modes and cases, or those named (`modes`, `cases`: results then in
    convergence[-quick]-MODES-CASES.json, beside the profile's own)."""
    name = "quick" if quick else "full"
    profile = dict(PROFILES[name])
    chosen = ""
    if modes or cases:
        profile.update(modes=modes or profile["modes"], cases=cases or profile["cases"])
        chosen = "-" + "-".join([*profile["modes"], *profile["cases"]])
    system = BenchSystem(HOME, list(REGIONS), dataplane=True)
    load_before = os.getloadavg()
    try:
        system.setup_django()
        system.start_syncd()
        system.start_workers(concurrency=3)
        corpus = "" if profile["corpus"] == "stdlib" else str(make_corpus(HOME / "corpus.txt"))
        runs = {(mode, case): run_once(system, profile, mode, case, corpus)
                for case in profile["cases"] for mode in profile["modes"]}
    finally:
        system.stop()
    common = evaluate(profile, {f"{m}/{c}": r for (m, c), r in runs.items()})
    shared = workload(profile, corpus, "decoupled", "none")
    names = [i["name"] for i in shared["islands"]]
    modes: dict[str, dict[str, Any]] = {}
    for (mode, case), run in runs.items():
        modes.setdefault(mode, {})[case] = report.figures(
            run, common, SyncConfig().fragments, shared["sync"]["inner_steps"])
    target = report.finish(modes)
    checks = report.checks(modes, profile["bounds"])
    record = {"profile": name, "wall_s": profile["wall_s"], "common_s": common,
              "load_before": [round(x, 2) for x in load_before],
              "load_after": [round(x, 2) for x in os.getloadavg()], "target_loss": target,
              "workload": shared, "kill_schedule": kill_schedule(SEED, profile["wall_s"], names),
              "modes": modes, "checks": checks}
    out = results.write(f"convergence{'-quick' if quick else ''}{chosen}", record)
    html = out.with_suffix(".html")
    html.write_text(report.figure_html(modes, f"bench convergence ({name})"))
    rows = [{"mode": m, "case": c, **{k: v for k, v in row.items() if k != "curve"}}
            for m, cases in modes.items() for c, row in cases.items()]
    print(results.table(rows, ["mode", "case", "eval_loss", "eval_loss_at_tokens", "tokens",
                               "outer_steps", "merges_per_window", "staleness_p95",
                               "time_to_target_s", "kills", "load", "waited_s"]))
    print(results.checks_table(checks))
    results.say(f"wrote {out} and {html}")
    return results.exit_code(checks)
