"""A model of the transformers library trained through the real system, and handed
back: `python -m bench models [--quick]`.

It starts the README's start command, `python -m webapp.start`, with state of its own
under var/bench-models, stops its demo run (bench/efficiency.py's steps, its code), and
trains the preset PRESET (diloco/presets.py: a Llama of transformers, 6 layers, 512 wide,
19.5M parameters with the bytes tokenizer, context 256) on its two islands for a fixed
budget: `warmup_outer_steps` and then `outer_steps` more outer steps of H =
`inner_steps` each, after which the run is stopped (its final checkpoint, then its
final evaluation). Side by side, in turns (bare, system, bare, then idle), as bench
efficiency measures them and with its figures (bench.efficiency.summarize):

- throughput: merged tokens/s of the system's window (bench.efficiency.system_phase)
  over the trained tokens/s of as many bare PyTorch loops of the same model as islands
  (bench.efficiency.bare_phase: bench.overhead.BareLoop, the same transformers model,
  batches and AdamW, no sends): `throughput_vs_bare`; beside it the same per
  CPU-second (`throughput.ratio_per_cpu`, `throughput.island_cpu_step_ratio`), which
  another load on the machine moves far less.
- held-out loss: the final status' eval_loss (nats per token, the validation split)
  and eval_bpb (bits per byte), as the run page shows them.
- the export: the final checkpoint's Hugging Face folder (webapp.runs.export, what the
  page's download gives) loaded by transformers' AutoModelForCausalLM and
  AutoTokenizer, with nothing of the project; its held-out loss on the same windows
  as the page's, computed as the folder's README says (`held_out_loss`), against
  the page's: `export_loss_equal`, the absolute difference.
- memory: each island process's peak resident bytes above its resident bytes before
  the run's spec (VmHWM less the heartbeat's idle_rss: the interpreter and the
  imports, which the estimate leaves out) against diloco.sizes' expected bytes of the
  island's host (its typical high-water mark): `estimate_memory`, the largest
  relative error over the islands; and against its peak, the bound admission uses,
  which it must not pass: `memory_within_peak`, the largest measured / peak.

It writes bench/results/models.json (models-quick.json with --quick), prints the
checks, and exits non-zero when one is missed.
"""

from __future__ import annotations

import io
import json
import os
import time
import zipfile
from pathlib import Path
from typing import Any

from bench import efficiency, results
from bench.goodput import make_corpus
from bench.system import ROOT, StartedSystem
from diloco.presets import PRESETS

HOME = ROOT / "var" / "bench-models"
PRESET = "llama_20m"
# The preset's model and learning rates; the batch and H of a run a shared CPU trains
# in minutes (quick) or in tens of minutes (full).
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"batch_size": 8, "inner_steps": 50, "fragments": 4, "warmup_outer_steps": 1,
             "outer_steps": 2, "bare_s": 90.0, "idle_s": 30.0, "held_out_tokens": 16384},
    "quick": {"batch_size": 2, "inner_steps": 16, "fragments": 2, "warmup_outer_steps": 1,
              "outer_steps": 2, "bare_s": 30.0, "idle_s": 10.0, "held_out_tokens": 4096},
}
TARGETS = {"throughput_vs_bare": 0.9, "export_loss_equal": 1e-4, "estimate_memory": 0.15,
           "memory_within_peak": 1.0}
EXPORT_BATCH = 32  # windows per forward pass, as the README's batches of 32


def run_config(profile: dict[str, Any], corpus: str) -> dict[str, Any]:
    """The preset's run on `corpus`, with the profile's batch, H, fragments and held-out
    tokens, and a budget it does not reach (the benchmark stops it)."""
    preset = PRESETS[PRESET][1]
    return {**preset, "data": {"path": corpus},
            "sync": {**preset["sync"], "inner_steps": profile["inner_steps"],
                     "fragments": profile["fragments"]},
            "eval": {"tokens": profile["held_out_tokens"]},
            "budget": {"total_tokens": 10**12},
            "islands": [{**island, "batch_size": profile["batch_size"]}
                        for island in preset["islands"]]}


def held_out_loss(folder: Path, prepared: Path, tokens: int, block_size: int) -> float:
    """The held-out loss of an exported folder as its README says it is computed, by
    transformers, numpy and torch alone: `tokens // block_size` windows of block_size
    evenly spaced over the prepared validation split, each window's mean next-token
    cross-entropy, their mean, fp32, in batches of EXPORT_BATCH."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    manifest = json.loads((prepared / "manifest.json").read_text())
    ids = np.fromfile(prepared / manifest["splits"]["validation"]["file"],
                      dtype=manifest.get("dtype", "uint8")).astype(np.int64)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                 dtype=torch.float32).eval()
    starts = torch.linspace(0, len(ids) - block_size - 1, max(1, tokens // block_size)).long()
    windows = torch.stack([torch.from_numpy(ids[s:s + block_size + 1]) for s in starts])
    losses = []
    with torch.no_grad():
        for batch in windows.split(EXPORT_BATCH):
            logits = model(input_ids=batch[:, :-1]).logits.float()
            losses.append(torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="none"
            ).view(len(batch), -1).mean(dim=1))
    return torch.cat(losses).mean().item()


def estimate_error(estimate: int, measured: int) -> float:
    """How far an estimate of bytes is from what was measured, relative to the measured."""
    if measured <= 0:
        raise ValueError(f"a measured size must be above 0 bytes, got {measured}")
    return abs(estimate - measured) / measured


def island_memory(store: Any) -> dict[str, dict[str, int]]:
    """Each island process's peak resident bytes and its resident bytes before the spec
    (its heartbeat's idle_rss), read while it trains."""
    from bench.scale import rss

    out = {}
    for name, beat in store.signals.heartbeats().items():
        now = rss(beat.pid) if beat.pid else None
        if now is None or not beat.idle_rss:
            raise RuntimeError(f"island {name}'s memory cannot be read (pid {beat.pid})")
        out[name] = {"peak_bytes": now[1], "idle_bytes": beat.idle_rss,
                     "above_idle_bytes": now[1] - beat.idle_rss}
    return out


def exported_loss(run: Any, home: Path) -> dict[str, Any]:
    """The stopped run's final checkpoint exported as the page's download gives it, and
    its held-out loss by transformers beside the page's."""
    from diloco.data import run_corpus
    from syncd.environment import data_dir
    from webapp.runs.export import hf_folder_zip
    from webapp.runs.reports import run_summary

    config = run.run_config()
    shown = run_summary(run)
    final = run.checkpoints.order_by("-created_at", "-id").first()
    folder = home / "export"
    zipfile.ZipFile(io.BytesIO(hf_folder_zip(final))).extractall(folder)
    prepared = Path(run_corpus(config.data, data_dir()).folder)
    loss = held_out_loss(folder, prepared, config.eval.tokens, config.model.block_size)
    return {"eval_loss": shown["eval_loss"], "eval_bpb": shown["eval_bpb"],
            "eval_tokens": shown["eval_tokens"], "checkpoint_eval_loss": final.eval_loss,
            "transformers_loss": loss, "export_files": sorted(p.name for p in folder.iterdir()),
            "export_loss_difference": abs(loss - shown["eval_loss"])}


def memory_figures(config: dict[str, Any], measured: dict[str, dict[str, int]]
                   ) -> dict[str, Any]:
    """Each island's measured peak above idle beside diloco.sizes' expected bytes and
    peak of it."""
    from diloco.config_parse import parse_config
    from diloco.sizes import estimate

    est = estimate(parse_config(config, list(efficiency.REGIONS)))
    islands = {name: {**m, "expected_bytes": est.expected[name].total,
                      "error": round(estimate_error(est.expected[name].total,
                                                    m["above_idle_bytes"]), 4),
                      "peak_estimate_bytes": est.islands[name].total,
                      "of_peak": round(m["above_idle_bytes"] / est.islands[name].total, 4)}
               for name, m in measured.items()}
    first = next(iter(measured))
    return {"params": est.params, "islands": islands,
            "estimate_error": max(i["error"] for i in islands.values()),
            "of_peak": max(i["of_peak"] for i in islands.values()),
            "expected_parts": est.expected[first].parts,
            "peak_parts": est.islands[first].parts}


def checks_of(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"throughput_vs_bare": results.check(figures["throughput_vs_bare"],
                                                TARGETS["throughput_vs_bare"]),
            "export_loss_equal": results.check(figures["export_loss_difference"],
                                               TARGETS["export_loss_equal"], at_least=False),
            "estimate_memory": results.check(figures["estimate_error"],
                                             TARGETS["estimate_memory"], at_least=False),
            "memory_within_peak": results.check(figures["memory_of_peak"],
                                                TARGETS["memory_within_peak"], at_least=False)}


def summarize(throughput: dict[str, Any], export: dict[str, Any], memory: dict[str, Any]
              ) -> dict[str, Any]:
    """The benchmark's figures: bench efficiency's of the run and the bare loops
    (`throughput`: efficiency.summarize, its ratio the throughput against bare), the
    export's and the memory's."""
    return {"params": memory["params"], "throughput_vs_bare": throughput["ratio"],
            "merged_tokens_per_s": throughput["merged_tokens_per_s"],
            "bare_tokens_per_s": throughput["bare_tokens_per_s"], "throughput": throughput,
            **export, "estimate_error": memory["estimate_error"],
            "memory_of_peak": memory["of_peak"], "island_memory": memory["islands"],
            "expected_parts": memory["expected_parts"],
            "peak_parts": memory["peak_parts"]}


def report(profile: dict[str, Any], quick: bool, figures: dict[str, Any], seconds: float,
           load_before: list[float]) -> int:
    out: dict[str, Any] = {"profile": "quick" if quick else "full", "preset": PRESET,
                           **profile, "cpus": os.cpu_count(), "targets": TARGETS,
                           "load_before": load_before, **figures,
                           "checks": checks_of(figures), "seconds": round(seconds, 1)}
    path = results.write("models-quick" if quick else "models", out)
    print(results.table([figures], ["params", "merged_tokens_per_s", "bare_tokens_per_s",
                                    "throughput_vs_bare", "eval_loss", "eval_bpb",
                                    "transformers_loss"]))
    print("\nPer CPU-second (what another load on the machine moves least):")
    print(results.table([figures["throughput"]], ["ratio_per_cpu", "island_cpu_step_ratio",
                                                  "island_cpu_ms_per_step",
                                                  "bare_cpu_ms_per_step"]))
    print()
    print(results.checks_table(out["checks"]))
    print(f"\n{out['seconds']} s on {out['cpus']} cpus (load average {load_before[0]:.2f} "
          f"before); wrote {path}")
    return results.exit_code(out["checks"])


def measure(system: StartedSystem, profile: dict[str, Any], home: Path) -> dict[str, Any]:
    """The phases in turn (bare, system, bare, idle) and the stopped run's export: the
    benchmark's figures, the phases' records among them (the samples file keeps them)."""
    from webapp.runs.models import Run

    efficiency.stop_demo(system)
    corpus = make_corpus(home / "data" / "corpus.txt")
    config = run_config(profile, str(corpus))
    model, islands = config["model"], len(config["islands"])
    bare = [efficiency.bare_phase(model, corpus, profile["bare_s"], "bare 1", islands,
                                  profile["batch_size"])]
    efficiency.wait_pools_ready(system)
    h = profile["inner_steps"]
    system_run = efficiency.system_phase(
        system, config, profile["warmup_outer_steps"] * h, profile["outer_steps"] * h,
        "system", before_stop=lambda run, store: {"island_memory": island_memory(store)})
    efficiency.wait(lambda: Run.objects.get(pk=system_run["run"]).state == Run.State.STOPPED,
                    "the run stopped, evaluated", system, efficiency.PHASE_TIMEOUT_S)
    export = exported_loss(Run.objects.get(pk=system_run["run"]), home)
    memory = memory_figures(config, system_run["island_memory"])
    efficiency.wait_pools_ready(system)
    bare.append(efficiency.bare_phase(model, corpus, profile["bare_s"], "bare 2", islands,
                                      profile["batch_size"]))
    idle = efficiency.idle_phase(system, profile["idle_s"])
    return summarize(efficiency.summarize(PRESET, [system_run], bare, idle, model), export,
                     memory)


def main(quick: bool = False, home: Path = HOME) -> int:
    profile = PROFILES["quick" if quick else "full"]
    started, load_before = time.time(), [round(x, 2) for x in os.getloadavg()]
    results.say(f"models: python -m webapp.start under {home}, preset {PRESET}")
    system = StartedSystem(home, list(efficiency.REGIONS))
    try:
        system.setup_django()
        figures = measure(system, profile, home)
    finally:
        system.stop()
    return report(profile, quick, figures, time.time() - started, load_before)
