"""syncd merge throughput against this machine's memory copy bandwidth.

`python -m bench merge` merges M = 8 updates of a fragment shaped like a whole
GPT of about 50M parameters (8 layers, width 704; --quick: about 5M) and
measures, side by side in one run, in rounds so that drift falls on all alike:

- memcpy: torch's copy_ of a 256 MiB float32 buffer into another, counted as
  bytes copied (each byte is read once and written once): the speed limit of
  any pass over memory on this machine;
- merge: each update, decoded beforehand, folded into a diloco.fold.RoundSum (token
  weights, RDA on non-embedding tensors), the sum normalised, and one Nesterov
  OuterOptimizer.step, the work syncd does per round;
- ingest + merge: for each update, the HMAC check and safetensors parse of its
  message (diloco.protocol.decode_message), its int4 payload opened
  (diloco.codecs.open_payload) and each tensor's norm taken from its codes, then its
  fold, which decodes it a chunk at a time into the sums, as syncd ingests it (each
  update is dropped once folded), and the same close;
- the merge's file: the merged fragment's full message and outer momentum written
  to syncd's files (syncd.published_files.PublishedFiles.save, a new version each
  round, as a merge makes it durable before its commit), counted as bytes written:
  beside memcpy, what making a merge durable costs against a pass over memory.

Both merge figures count M x the fragment's float32 bytes per round, so their
ratio to memcpy says how close syncd comes to the machine's limit. A fold
reads every update twice (its norms, then the running sum's add), so it cannot
reach memcpy; the target is a quarter of it. Torch runs with its
default number of threads. It writes bench/results/merge.json, prints a table,
and exits non-zero if the merge alone is below its bound.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from bench import results
from bench.system import ROOT
from diloco import codecs
from diloco.fold import RoundSum
from diloco.merge import OuterOptimizer, Update
from diloco.model import GPT, GPTConfig, embedding_tensor_names
from diloco.protocol import decode_message, encode_message
from diloco.signing import island_key, publish_key
from syncd.published_files import PublishedFiles

SECRET = b"bench-merge"
KEY = island_key(SECRET, "bench", 1)  # the key of every update
CODEC = "int4"
COPY_BYTES = 256 * 1024 * 1024
FILES = ROOT / "var" / "bench-merge"  # the files of the merge pass, as syncd's of a run

PROFILES: dict[str, dict[str, Any]] = {
    "full": {"model": {"n_layer": 8, "n_embd": 704, "n_head": 8, "block_size": 1024},
             "updates": 8, "rounds": 9, "bounds": {"ratio_to_memcpy": 0.25}},
    "quick": {"model": {"n_layer": 4, "n_embd": 320, "n_head": 8, "block_size": 256},
              "updates": 8, "rounds": 3, "bounds": {"ratio_to_memcpy": 0.25}},
}


def gpt_shapes(model: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a GPT, built on the meta device: no memory, no init cost."""
    with torch.device("meta"):
        gpt = GPT(GPTConfig(**model))
    return {name: tuple(t.shape) for name, t in gpt.state_dict().items()}


def make_messages(shapes: dict[str, tuple[int, ...]], m: int) -> list[bytes]:
    """M signed int4 update messages of islands with different batch sizes."""
    generator = torch.Generator().manual_seed(0)
    blobs = []
    for i in range(m):
        delta = {n: torch.randn(s, generator=generator) * 1e-3 for n, s in shapes.items()}
        tokens = 512 * (4 + 2 * (i % 3)) * 50  # batch 4, 6 or 8 of 512 tokens, 50 steps
        meta = {"run": "bench", "island": f"island-{i}", "epoch": 0, "fragment": 0,
                "base_version": 3, "seq": 200, "tokens": tokens, "inner_steps": 50,
                "compute_s": 1.0, "codec": CODEC}
        blobs.append(encode_message("update", meta, codecs.encode(delta, CODEC), KEY))
    return blobs


def ingest(blob: bytes, shapes: dict[str, tuple[int, ...]]) -> Update:
    """What syncd does with a message before it can merge it (syncd.ingest's
    verify_update and check_update): its tensors as they came, and their norms."""
    _, meta, tensors = decode_message(blob, KEY)
    delta = codecs.open_payload(tensors, meta["codec"], shapes)
    norms = {name: t.norm() for name, t in delta.items()}
    return Update(meta["island"], meta["base_version"], meta["tokens"], meta["inner_steps"],
                  delta, meta["seq"], norms)


def decoded(update: Update) -> Update:
    """The update with its tensors decoded: the merge pass folds float32 tensors alone."""
    return replace(update, delta={name: t.decode() for name, t in update.delta.items()})


class Fragment:
    """The global parameters and outer optimizer that merges are applied to."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        generator = torch.Generator().manual_seed(1)
        self.params = {n: torch.randn(s, generator=generator) * 0.02 for n, s in shapes.items()}
        self.optimizer = OuterOptimizer(lr=0.7, momentum=0.9)

    def merge(self, updates: Iterable[Update]) -> None:
        round_sum = RoundSum("tokens", rda=True, embedding_names=embedding_tensor_names())
        for update in updates:
            round_sum.add(update)
        merged, _ = round_sum.merged()
        # A partial round (share < 1) takes the general path of the step.
        self.params = self.optimizer.step(self.params, merged, share=0.75, consume_grad=True)


def time_save(files: PublishedFiles, version: int, fragment: Fragment) -> tuple[float, int]:
    """Seconds to make `fragment` durable at `version` as syncd does before a commit,
    and the bytes written (its signed full message is made first, untimed)."""
    meta = {"run": "bench", "fragment": 0, "version": version, "base_version": -1,
            "codec": "none"}
    full = encode_message("global", meta, fragment.params, publish_key(SECRET))
    started = time.perf_counter()
    written = files.save(0, version, 0, full, fragment.optimizer.state_dict())
    return time.perf_counter() - started, written


def time_copy(src: torch.Tensor, dst: torch.Tensor, repeats: int = 3) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    return (time.perf_counter() - started) / repeats


def time_merge(fragment: Fragment, updates: list[Update]) -> float:
    started = time.perf_counter()
    fragment.merge(updates)
    return time.perf_counter() - started


def time_ingest(fragment: Fragment, blobs: list[bytes], shapes: dict[str, tuple[int, ...]]
                ) -> float:
    started = time.perf_counter()
    fragment.merge(ingest(b, shapes) for b in blobs)  # each folded, then dropped
    return time.perf_counter() - started


def main(quick: bool = False) -> int:
    profile = PROFILES["quick" if quick else "full"]
    started = time.time()
    shapes = gpt_shapes(profile["model"])
    m = profile["updates"]
    params = sum(torch.Size(s).numel() for s in shapes.values())
    fragment_bytes = 4 * params
    merged_bytes = m * fragment_bytes
    results.say(f"merge: {m} updates of {params:,} parameters ({fragment_bytes / 2**20:.0f} MiB "
                f"fp32 each), {profile['rounds']} rounds, {torch.get_num_threads()} threads; "
                f"preparing messages")
    blobs = make_messages(shapes, m)
    updates = [decoded(ingest(b, shapes)) for b in blobs]
    fragment = Fragment(shapes)
    src = torch.rand(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    # As many bytes copied per round as merged, so both passes last about as long.
    copies = max(1, merged_bytes // COPY_BYTES)
    time_copy(src, dst, 1)  # warm up: first touch of dst, the momentum buffers, the
    time_ingest(fragment, blobs, shapes)  # allocator's cache of large blocks
    files = PublishedFiles(FILES)
    files.clear()

    rows = []
    for r in range(profile["rounds"]):
        copy_rate = COPY_BYTES / time_copy(src, dst, copies)
        merge_rate = merged_bytes / time_merge(fragment, updates)
        ingest_rate = merged_bytes / time_ingest(fragment, blobs, shapes)
        save_s, saved_bytes = time_save(files, r + 1, fragment)
        file_rate = saved_bytes / save_s
        rows.append({"round": r + 1, "memcpy_bytes_per_s": copy_rate,
                     "merge_bytes_per_s": merge_rate, "ingest_bytes_per_s": ingest_rate,
                     "file_bytes_per_s": file_rate,
                     "ratio_to_memcpy": merge_rate / copy_rate,
                     "ingest_ratio_to_memcpy": ingest_rate / copy_rate,
                     "file_ratio_to_memcpy": file_rate / copy_rate})
        results.say(f"  round {r + 1}/{profile['rounds']}: memcpy {copy_rate / 1e9:.2f} GB/s, "
                    f"merge {merge_rate / 1e9:.2f} GB/s, ingest + merge "
                    f"{ingest_rate / 1e9:.2f} GB/s, the merge's file {saved_bytes / 2**20:.0f} "
                    f"MiB in {save_s:.2f} s")
    files.clear()

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    out: dict[str, Any] = {
        "ratio_to_memcpy": median("ratio_to_memcpy"),
        "ingest_ratio_to_memcpy": median("ingest_ratio_to_memcpy"),
        "memcpy_bytes_per_s": median("memcpy_bytes_per_s"),
        "memcpy_counts": "bytes copied (each read once and written once) per second, "
                         f"copy_ of a {COPY_BYTES // 2**20} MiB float32 buffer",
        "merge_bytes_per_s": median("merge_bytes_per_s"),
        "ingest_bytes_per_s": median("ingest_bytes_per_s"),
        "merge_s": merged_bytes / median("merge_bytes_per_s"),
        "ingest_s": merged_bytes / median("ingest_bytes_per_s"),
        "file_ratio_to_memcpy": median("file_ratio_to_memcpy"),
        "file_bytes_per_s": median("file_bytes_per_s"),
        "file_bytes": saved_bytes,
        "file_s": saved_bytes / median("file_bytes_per_s"),
        "updates": m, "model_params": params, "model": profile["model"],
        "fragment_bytes": fragment_bytes, "merged_bytes": merged_bytes,
        "message_bytes": len(blobs[0]), "codec": CODEC, "weighting": "tokens", "rda": True,
        "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True, "share": 0.75},
        "threads": torch.get_num_threads(), "rounds": len(rows), "per_round": rows,
    }
    bound = profile["bounds"]["ratio_to_memcpy"]
    out["checks"] = {"merge / memcpy bytes/s": results.check(out["ratio_to_memcpy"], bound)}
    out["profile"] = "quick" if quick else "full"
    out["seconds"] = round(time.time() - started, 1)
    # A quick run keeps its own file, so it never hides the figures of the full one.
    path = results.write("merge-quick" if quick else "merge", out)

    print(results.table([
        {"pass": "memcpy", "GB_per_s": out["memcpy_bytes_per_s"] / 1e9, "ratio_to_memcpy": 1.0},
        {"pass": "merge", "GB_per_s": out["merge_bytes_per_s"] / 1e9,
         "ratio_to_memcpy": out["ratio_to_memcpy"], "seconds": out["merge_s"]},
        {"pass": "ingest + merge", "GB_per_s": out["ingest_bytes_per_s"] / 1e9,
         "ratio_to_memcpy": out["ingest_ratio_to_memcpy"], "seconds": out["ingest_s"]},
        {"pass": "the merge's file", "GB_per_s": out["file_bytes_per_s"] / 1e9,
         "ratio_to_memcpy": out["file_ratio_to_memcpy"], "seconds": out["file_s"]},
    ], ["pass", "GB_per_s", "ratio_to_memcpy", "seconds"]))
    print()
    print(results.checks_table(out["checks"]))
    print(f"\n{m} updates of {params:,} parameters ({merged_bytes / 2**20:,.0f} MiB fp32 merged "
          f"per round, {len(blobs[0]) / 2**20:.1f} MiB per {CODEC} message); memcpy counts bytes "
          f"copied; {out['threads']} threads; ratios are medians of per-round ratios; "
          f"{out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])
