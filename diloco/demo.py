"""python -m diloco.demo: the demo run, 4 islands in 2 regions, in this process.

It trains a small model with Decoupled DiLoCo on the default corpus and prints
its progress: what `make start` shows until the distributed runtime runs it on
Celery workers and syncd.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from diloco.cluster import run_local
from diloco.config import RunConfig
from diloco.config_parse import parse_config

DEMO = {
    "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64},
    "sync": {"inner_steps": 50, "fragments": 4, "overlap_steps": 2, "min_quorum": 2},
    "optim": {"inner_lr": 2e-3, "warmup_steps": 50},
    "budget": {"total_tokens": 1_000_000},
    "islands": [
        {"name": "us-east-a", "region": "us-east", "batch_size": 8, "speed": 1.0},
        {"name": "us-east-b", "region": "us-east", "batch_size": 8, "speed": 1.0},
        {"name": "us-west-a", "region": "us-west", "batch_size": 8, "speed": 0.7},
        {"name": "us-west-b", "region": "us-west", "batch_size": 4, "speed": 0.5},
    ],
}


def demo_config(total_tokens: int) -> RunConfig:
    data = {**DEMO, "budget": {"total_tokens": total_tokens}}
    return parse_config(data, ["us-east", "us-west"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=DEMO["budget"]["total_tokens"])
    parser.add_argument("--data-dir", type=Path, default=Path("var/data"),
                        help="the data directory, where the corpus is prepared")
    args = parser.parse_args()
    config = demo_config(args.tokens)
    started = time.time()
    print(f"demo run: {len(config.islands)} islands in 2 regions, "
          f"{config.budget.total_tokens:,} tokens, mode decoupled", flush=True)

    def progress(point: dict) -> None:
        print(f"  {point['tokens']:>10,} tokens  outer_steps {point['outer_steps']:>3}  "
              f"eval loss {point['eval_loss']:.3f}  ({time.time() - started:.0f} s)", flush=True)

    result = run_local(config, "decoupled", data_dir=args.data_dir, eval_points=10,
                       progress=progress)
    print(f"done: eval loss {result.eval_loss:.3f}, {result.merges} merges, "
          f"{result.bytes_sent / result.tokens:.1f} bytes per token on the wire", flush=True)


if __name__ == "__main__":
    main()
