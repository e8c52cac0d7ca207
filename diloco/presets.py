"""The named starting points of a new run's config (the webapp's form offers them,
fitted to a deployment's regions by webapp/runs/presets.py; the API takes any config),
as plain data that `bench quality --preset` trains as well."""

from __future__ import annotations

import json
from typing import Any

from diloco.demo import DEMO

PAPER_REGIONS = ("us-east", "us-central", "us-west", "us-south")
# The one-way latency of an island's link in each region.
PAPER_LATENCY_MS = dict(zip(PAPER_REGIONS, (10, 20, 35, 25), strict=True))
# The paper's wide-area links carry 2-5 Gb/s; the presets take the low end.
PAPER_BANDWIDTH_GBPS = 2.0

# gpt2_small (a real size) and paper (the paper's regions and links) send int4 updates
# and pull int8 differences, as a run over such links would. Why these codecs: in
# `python -m bench quality` (docs/BENCHMARKS.md, full profile) decoupled with int4 up
# and int4 down reached 1.006 times the eval loss of decoupled in float32 both ways, on a
# model of 185K parameters; int8 down is finer than the int4 down measured there. At
# gpt2_small's own size (85.6M parameters), `python -m bench quality --preset gpt2_small`
# on a GPU (docs/BENCHMARKS.md) had these codecs at 0.999 times float32's test loss, at
# 5.0x fewer bytes per token, over 2M tokens and two seeds: early in training, not at
# the preset's 20M-token budget.
# A lossy downlink publishes differences, and the synchronizer keeps the last
# sync.max_staleness of them (at least one; diloco/synchronizer.py history_length): the
# default 4, which the size estimate counts. An island further behind takes the full
# fragment; no rule between fields constrains these codecs.
REAL_SIZE_CODECS: dict[str, str] = {"compression": "int4", "downlink_compression": "int8"}

# No vocab_size: the model takes the tokenizer's (256 for bytes, data.vocab_size for a
# trained one; diloco.config.tokenizer_vocab).
LLAMA_20M = {"model_type": "llama", "hidden_size": 512,
             "intermediate_size": 1408, "num_hidden_layers": 6, "num_attention_heads": 8,
             "num_key_value_heads": 8, "max_position_embeddings": 256}
# The benchmarks' Llama of >= 100M parameters (`bench scale`, `bench dataplane`): the
# builtin 113M's depth and width (16 layers, 768 wide, 12 heads), Llama's MLP of 8/3
# the width (2,048), 113.7M parameters with bytes.
LLAMA_114M = {"model_type": "llama", "hidden_size": 768,
              "intermediate_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 12,
              "num_key_value_heads": 12, "max_position_embeddings": 256}

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "demo": ("demo: 4 islands, 2 regions", DEMO),
    "paper": ("four US regions like the paper", {
        **DEMO,
        "sync": {"inner_steps": 50, "fragments": 4, "overlap_steps": 2, "min_quorum": 2,
                 **REAL_SIZE_CODECS},
        "islands": [{"name": f"{region}-a", "region": region, "batch_size": 8,
                     "bandwidth_gbps": PAPER_BANDWIDTH_GBPS, "latency_ms": latency}
                    for region, latency in PAPER_LATENCY_MS.items()],
    }),
    # GPT-2 small's shape (12 layers, 768 wide, 12 heads): 85.6M parameters with the
    # byte vocabulary and a context of 256, about 340 MB in float32.
    "gpt2_small": ("GPT-2 small's shape: 85M parameters, 2 islands", {
        **DEMO,
        "model": {"n_layer": 12, "n_embd": 768, "n_head": 12, "block_size": 256},
        "sync": {**DEMO["sync"], **REAL_SIZE_CODECS},
        "optim": {"inner_lr": 6e-4, "warmup_steps": 100},
        "budget": {"total_tokens": 20_000_000},
        "islands": [{"name": f"{region}-a", "region": region, "batch_size": 8,
                     "bandwidth_gbps": PAPER_BANDWIDTH_GBPS,
                     "latency_ms": PAPER_LATENCY_MS[region]}
                    for region in ("us-east", "us-west")],
    }),
    # A Llama of the transformers library (model.source hf, diloco/hf.py): 6 layers, 512
    # wide, 8 heads, an MLP of 1,408, the tokenizer's vocabulary (19.5M parameters with
    # bytes), context 256: small enough to train here in minutes.
    "llama_20m": ("a Llama of transformers: 20M parameters, 2 islands", {
        **DEMO,
        "model": {"source": "hf", "hf_config": json.dumps(LLAMA_20M), "block_size": 256},
        "optim": {"inner_lr": 6e-4, "warmup_steps": 100},
        "islands": [{"name": f"{region}-a", "region": region, "batch_size": 8}
                    for region in ("us-east", "us-west")],
    }),
    # LLAMA_114M over the paper's links at gpt2_small's codecs: the size the benchmarks
    # measure Llamas at, 113.7M parameters with bytes (125.9M with a BPE of 8,192 ids).
    "llama_114m": ("a Llama of transformers: 114M parameters, 2 islands", {
        **DEMO,
        "model": {"source": "hf", "hf_config": json.dumps(LLAMA_114M), "block_size": 256},
        "sync": {**DEMO["sync"], **REAL_SIZE_CODECS},
        "optim": {"inner_lr": 6e-4, "warmup_steps": 100},
        "islands": [{"name": f"{region}-a", "region": region, "batch_size": 8,
                     "bandwidth_gbps": PAPER_BANDWIDTH_GBPS,
                     "latency_ms": PAPER_LATENCY_MS[region]}
                    for region in ("us-east", "us-west")],
    }),
    "custom": ("custom: the defaults", {}),
}
