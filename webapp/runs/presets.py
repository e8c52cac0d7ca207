"""Named starting points for a new run's config, fitted to the regions this
deployment has. The form offers them; the API takes any config."""

from __future__ import annotations

import copy
from typing import Any

from diloco.config import RunConfig
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
# model of 185K parameters; int8 down is finer than the int4 down measured there. That
# ratio is for small models: it has not been checked again at these presets' sizes (85M
# parameters for gpt2_small), and nothing here claims it holds there.
# A lossy downlink publishes differences, and the synchronizer keeps the last
# sync.max_staleness of them (at least one; diloco/synchronizer.py history_length): the
# default 4, which the size estimate counts. An island further behind takes the full
# fragment; no rule between fields constrains these codecs.
REAL_SIZE_CODECS = {"compression": "int4", "downlink_compression": "int8"}

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
    "custom": ("custom: the defaults", {}),
}


def preset_config(name: str, regions: list[str]) -> dict[str, Any]:
    """The full config of preset `name`, each island moved to a region of `regions`
    when its own is not there (regions in order of first use, so islands that shared a
    region still share one).

    Raises:
        ValueError: for an unknown preset or no regions.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
    if not regions:
        raise ValueError("a deployment needs at least one region")
    config = {**RunConfig().to_dict(), **copy.deepcopy(PRESETS[name][1])}
    defaults = RunConfig().to_dict()
    for section, values in config.items():
        if isinstance(values, dict):
            config[section] = {**defaults[section], **values}
    wanted = list(dict.fromkeys(island["region"] for island in config["islands"]))
    missing = [r for r in wanted if r not in regions]
    spare = [r for r in regions if r not in wanted] or list(regions)
    mapping = {r: spare[i % len(spare)] for i, r in enumerate(missing)}
    island_defaults = RunConfig().to_dict()["islands"][0]
    config["islands"] = [{**island_defaults, **island,
                          "region": mapping.get(island["region"], island["region"])}
                         for island in config["islands"]]
    return config
