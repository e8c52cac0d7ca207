"""GPU smoke: an island's inner loop on the best device here, fp32 against bf16.

`python -m bench.gpu_smoke` trains a mid-sized model for a few hundred inner
steps with diloco.island.Island, the loop every island runs, on cuda when
the host has a GPU: once in fp32 and once with bf16 autocast (train.precision),
from the same initial weights on the same batches. Every `inner_steps` steps it
sends each fragment and mixes a global back in, so fragments go through the
pinned host buffers both ways; a send encodes with the real-size presets' uplink
codec (int4, diloco/presets.py) and is signed as the runner signs it, and the
milliseconds of each part (the update made and encoded, its signature, the mix)
are reported per send: the training thread's time that a send costs, beside the
step's. It prints tokens/s per precision, writes
bench/results/gpu_smoke.json (gpu_smoke-quick.json with `--quick`) and exits
non-zero if a check fails: the loss falls in both runs, bf16 ends close to
fp32, (on a GPU, full profile) bf16 is faster, and (on a GPU) fragments come back
through the pinned buffers exactly and an int4 update encoded there has exactly the
host's codes. `--quick` runs a small model
for a few dozen steps, on the CPU too.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch

from bench import results
from diloco import codecs
from diloco.config import RunConfig
from diloco.config_parse import parse_config
from diloco.data import load_corpus
from diloco.device import HostStaging, resolve_device
from diloco.fragments import due_fragments, partition
from diloco.island import Island, initial_model
from diloco.presets import REAL_SIZE_CODECS
from diloco.protocol import encode_message
from diloco.signing import island_key
from syncd.environment import data_dir

CODEC = REAL_SIZE_CODECS["compression"]  # what a send encodes with
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"model": {"n_layer": 8, "n_embd": 768, "n_head": 12, "block_size": 512},
             "batch_size": 16, "steps": 300, "warmup": 20, "inner_steps": 50,
             "fragments": 4, "bounds": {"bf16_speedup": 1.2, "loss_gap": 0.1}},
    "quick": {"model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64},
              "batch_size": 8, "steps": 40, "warmup": 5, "inner_steps": 10,
              "fragments": 2, "bounds": {"bf16_speedup": 0.0, "loss_gap": 0.25}},
}


def make_config(profile: dict[str, Any], precision: str) -> RunConfig:
    return parse_config({
        "model": profile["model"],
        "sync": {"inner_steps": profile["inner_steps"], "fragments": profile["fragments"],
                 "overlap_steps": 0, "min_quorum": 1},
        "optim": {"inner_lr": 6e-4, "warmup_steps": profile["warmup"]},
        "train": {"precision": precision},
        "islands": [{"name": "smoke", "region": "us-east",
                     "batch_size": profile["batch_size"]}],
    }, ["us-east"])


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def train(profile: dict[str, Any], precision: str, device: str) -> dict[str, Any]:
    """Train one island; time the steps after the warmup ones, and the fragment round trips."""
    config = make_config(profile, precision)
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    init = initial_model(config).state_dict()
    fragments = partition({n: t.numel() for n, t in init.items()}, config.sync.fragments)
    island = Island(0, config, corpus, fragments, init, device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    key = island_key(b"smoke", "smoke", 1)
    losses, step_s, sync_s = [], 0.0, 0.0
    parts = {"update_ms": 0.0, "sign_ms": 0.0, "mix_ms": 0.0}
    sends = 0
    for step in range(1, profile["steps"] + 1):
        synchronize(device)
        started = time.perf_counter()
        losses.append(island.inner_step())  # .item() waits for the step to finish
        if step > profile["warmup"]:
            step_s += time.perf_counter() - started
        started = time.perf_counter()
        for p in due_fragments(island.step, config.sync.inner_steps, config.sync.fragments):
            # The way out and back of a sync with tau = 0, the global standing in for
            # syncd's merge: this island's own fragment as it was sent.
            sent = {n: t.detach().cpu() for n, t in island.fragment_params(p).items()}
            marks = [time.perf_counter()]
            meta, payload = island.make_update(p, CODEC)
            marks.append(time.perf_counter())
            meta.update(run="smoke", island="smoke", epoch=1, compute_s=0.0, codec=CODEC)
            encode_message("update", meta, payload, key)
            marks.append(time.perf_counter())
            island.mix_global(p, sent, island.state[p].version + 1)
            synchronize(device)
            marks.append(time.perf_counter())
            for part, begun, ended in zip(parts, marks[:-1], marks[1:], strict=True):
                parts[part] += 1000 * (ended - begun)
            sends += 1
        synchronize(device)
        sync_s += time.perf_counter() - started
    timed = profile["steps"] - profile["warmup"]
    tail = max(1, profile["steps"] // 10)
    return {
        "precision": precision, "device": device,
        "tokens_per_s": island.tokens_per_step * timed / step_s,
        "ms_per_step": 1000 * step_s / timed,
        "sync_ms_per_step": 1000 * sync_s / profile["steps"],
        "first_loss": sum(losses[:tail]) / tail, "last_loss": sum(losses[-tail:]) / tail,
        "peak_gib": (torch.cuda.max_memory_allocated(device) / 2**30
                     if device.startswith("cuda") else None),
        "params": island.model.num_params(), "tokens_per_step": island.tokens_per_step,
        "codec": CODEC, "fragment_params": max(f.numel for f in fragments),
        **{f"{part}_per_send": ms / max(1, sends) for part, ms in parts.items()},
    }


def main(quick: bool = False) -> int:
    device = resolve_device("auto")
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # as an island process does: islands share a host's cores
    try:
        return measure(PROFILES["quick" if quick else "full"], device, quick)
    finally:
        torch.set_num_threads(threads)


def pinned_round_trip(device: str) -> bool:
    """Fragments to the GPU and back through HostStaging's pinned buffers come back exact,
    in buffers that are pinned, and the caller's copy is its own."""
    staging = HostStaging(device)
    host = {"a": torch.randn(256, 64), "b": torch.randn(7)}
    back = staging.to_host({n: t * 2 for n, t in staging.to_device(host).items()})
    return (all(b.is_pinned() for b in staging.buffers.values())
            and all(torch.equal(back[n], host[n] * 2) for n in host)
            and all(back[n].data_ptr() != staging.buffers[n].data_ptr() for n in host))


def encoded_on_the_device_as_on_the_host(device: str, codec: str) -> bool:
    """An update encoded on the device has the codes and scales the host's encoding of
    the same values has, and decodes there to the host's decoded values, exactly."""
    values = {"w": torch.randn(1000, 777) * 0.01, "b": torch.randn(13)}
    shapes = {n: tuple(t.shape) for n, t in values.items()}
    host = codecs.encode(values, codec)
    there = codecs.encode({n: t.to(device) for n, t in values.items()}, codec)
    decoded = codecs.decode(there, codec, shapes)
    return (all(torch.equal(there[n].cpu(), host[n]) for n in host)
            and all(torch.equal(decoded[n].cpu(), t)
                    for n, t in codecs.decode(host, codec, shapes).items()))


def measure(profile: dict[str, Any], device: str, quick: bool) -> int:
    started = time.time()
    where = device if device == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})"
    results.say(f"gpu_smoke: {'quick' if quick else 'full'} profile on {where}")
    runs = {}
    for precision in ("fp32", "bf16"):
        runs[precision] = train(profile, precision, device)
        run = runs[precision]
        results.say(f"  {precision}: {run['tokens_per_s']:,.0f} tokens/s, loss "
                    f"{run['first_loss']:.3f} -> {run['last_loss']:.3f}")
    fp32, bf16 = runs["fp32"], runs["bf16"]
    speedup = bf16["tokens_per_s"] / fp32["tokens_per_s"]
    bounds = profile["bounds"]
    gpu_full = device != "cpu" and not quick
    checks = {
        "fp32 loss falls": results.check(fp32["first_loss"] - fp32["last_loss"], 0.0),
        "bf16 loss falls": results.check(bf16["first_loss"] - bf16["last_loss"], 0.0),
        "bf16 - fp32 final loss": results.check(
            abs(bf16["last_loss"] - fp32["last_loss"]) if math.isfinite(bf16["last_loss"])
            else math.inf, bounds["loss_gap"], at_least=False),
        "bf16 / fp32 tokens/s": results.check(speedup, bounds["bf16_speedup"] if gpu_full
                                              else 0.0),
    }
    out = {"device": device, "profile": "quick" if quick else "full", "model": profile["model"],
           "batch_size": profile["batch_size"], "steps": profile["steps"],
           "timed_steps": profile["steps"] - profile["warmup"], "bf16_speedup": speedup,
           "runs": runs, "checks": checks, "seconds": round(time.time() - started, 1)}
    if device != "cpu":
        out["gpu"] = torch.cuda.get_device_name(device)
        checks["fragments through pinned buffers, exact"] = results.check(
            float(pinned_round_trip(device)), 1.0)
        checks[f"{CODEC} encoded on the device as on the host, exact"] = results.check(
            float(encoded_on_the_device_as_on_the_host(device, CODEC)), 1.0)
    path = results.write("gpu_smoke-quick" if quick else "gpu_smoke", out)
    print(results.table(list(runs.values()), ["precision", "device", "tokens_per_s",
                                              "ms_per_step", "sync_ms_per_step", "first_loss",
                                              "last_loss", "peak_gib"]))
    print()
    print(results.table(list(runs.values()), ["precision", "codec", "fragment_params",
                                              "update_ms_per_send", "sign_ms_per_send",
                                              "mix_ms_per_send"]))
    print()
    print(results.checks_table(checks))
    print(f"\nmodel: {fp32['params']:,} parameters, {fp32['tokens_per_step']:,} tokens per "
          f"step, {out['timed_steps']} timed steps per precision; bf16 is {speedup:.2f}x "
          f"fp32; {out['seconds']} s; wrote {path}")
    return results.exit_code(checks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_smoke", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="a small model for a few dozen steps; runs on the CPU too")
    raise SystemExit(main(quick=parser.parse_args().quick))
