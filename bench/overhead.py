"""Island overhead: an island's inner-loop tokens/s against a bare PyTorch loop.

`python -m bench overhead` trains the same model two ways, side by side in one
run, in rounds of H steps each; within a round the two loops take turns step
by step (island, bare, island, bare, ...; the next round starts with bare), so
drift of the machine's speed and bursts of other work fall on both alike:

- island: diloco.island.Island.inner_step, the loop every island runs:
  warmup schedule, AdamW, gradient clipping, token accounting, loss.item();
  after each step it also sends the fragments that are due (make_update with
  the run's codec and error feedback, then encode_message), timed apart;
- bare: the same model class (diloco.model.GPT, or diloco.hf.CausalLM) from the
  same initial weights, the same batch shape, AdamW with the same settings, and
  nothing else.

Both draw their batches with a ShardSampler of the same shard and seed, so they
see the same data in the same order and pay the same for it; what differs is
what the island adds. Torch runs on one thread, as an island process does
(trainer/runner.py: several islands share a host's cores). `ratio` is
island/bare tokens/s without the sends (the median of the per-round ratios);
`ratio_with_sync` counts the sends too, one per fragment per H steps, which is
an island's whole per-step cost before it mixes in globals. It writes
bench/results/overhead.json, prints a table, and exits non-zero if island/bare
is below its bound.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from bench import results
from diloco.config import RunConfig
from diloco.config_parse import parse_config
from diloco.data import Corpus, ShardSampler, load_corpus
from diloco.fragments import due_fragments, partition
from diloco.island import Island, build_model, gpt_config, initial_model
from diloco.protocol import encode_message
from diloco.signing import island_key
from syncd.environment import data_dir

KEY = island_key(b"bench-overhead", "bench", 0)  # the key of every update

# The full run trains the demo's model at an island's default batch; a round is
# one outer period (H steps), so every round sends each fragment once.
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64},
             "batch_size": 8, "inner_steps": 50, "fragments": 4, "codec": "int4",
             "rounds": 40, "data_path": "", "bounds": {"ratio": 0.95}},
    "quick": {"model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64},
              "batch_size": 8, "inner_steps": 20, "fragments": 4, "codec": "int4",
              "rounds": 8, "data_path": "", "bounds": {"ratio": 0.90}},
}


def make_config(profile: dict[str, Any]) -> RunConfig:
    data = {
        "model": profile["model"],
        "data": {"path": profile["data_path"]},
        "sync": {"inner_steps": profile["inner_steps"], "fragments": profile["fragments"],
                 "min_quorum": 1, "compression": profile["codec"]},
        "optim": {"inner_lr": 2e-3, "weight_decay": 0.1, "warmup_steps": 100},
        "islands": [{"name": "bench", "region": "us-east", "batch_size": profile["batch_size"]}],
    }
    return parse_config(data, ["us-east"])


class BareLoop:
    """The plainest training loop over the same model, batches and AdamW settings;
    with `clip`, it clips the gradient's norm at 1.0 as an island does
    (bench/efficiency.py's bare loops)."""

    def __init__(self, config: RunConfig, corpus: Corpus, init: dict[str, torch.Tensor],
                 clip: bool = False):
        self.model = build_model(gpt_config(config))  # the island's class: GPT or CausalLM
        self.model.load_state_dict(init)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.optim.inner_lr,
                                           betas=(0.9, 0.95),
                                           weight_decay=config.optim.weight_decay)
        self.sampler = ShardSampler(corpus, 0, 1, config.model.block_size, config.seed)
        self.batch_size = config.islands[0].batch_size
        self.clip = clip

    def step(self) -> None:
        x, y = self.sampler.batch(self.batch_size)
        _, loss = self.model(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()


def send_due(island: Island) -> None:
    """Send the fragments due after the island's last step, as trainer/runner.py does."""
    s = island.config.sync
    for p in due_fragments(island.step, s.inner_steps, s.fragments):
        meta, payload = island.make_update(p, s.compression)
        meta.update(run="bench", island=island.name, epoch=0, compute_s=0.0,
                    codec=s.compression)
        encode_message("update", meta, payload, KEY)


def run_round(island: Island, bare: BareLoop, steps: int, island_first: bool
              ) -> tuple[float, float, float]:
    """(island, of which sends, bare) seconds for `steps` steps of each, taken in turns.

    Steps alternate one by one, so a burst of other work on the machine lands
    on both loops alike; the order within a pair flips from round to round.
    """
    clock = time.perf_counter
    island_s = sync_s = bare_s = 0.0
    for _ in range(steps):
        for arm in ("island", "bare") if island_first else ("bare", "island"):
            started = clock()
            if arm == "bare":
                bare.step()
                bare_s += clock() - started
                continue
            island.inner_step()
            stepped = clock()
            send_due(island)
            sync_s += clock() - stepped
            island_s += clock() - started
    return island_s, sync_s, bare_s


def main(quick: bool = False) -> int:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure(PROFILES["quick" if quick else "full"], quick)
    finally:
        torch.set_num_threads(threads)


def measure(profile: dict[str, Any], quick: bool) -> int:
    started = time.time()
    config = make_config(profile)
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    init = {k: v.detach().clone() for k, v in initial_model(config).state_dict().items()}
    fragments = partition({k: v.numel() for k, v in init.items()}, config.sync.fragments)
    island = Island(0, config, corpus, fragments, init)
    bare = BareLoop(config, corpus, init)
    steps = config.sync.inner_steps
    tokens = island.tokens_per_step * steps
    params = island.model.num_params()
    results.say(f"overhead: {params:,} parameters, batch {profile['batch_size']} x "
                f"{config.model.block_size}, {profile['rounds']} rounds of {steps} steps, "
                f"{torch.get_num_threads()} threads")
    run_round(island, bare, steps, True)  # warm up both: allocator, AdamW state, first sends

    rows = []
    for r in range(profile["rounds"]):
        total, sending, plain = run_round(island, bare, steps, island_first=r % 2 == 0)
        rows.append({"round": r + 1, "island_s": total - sending, "sync_s": sending,
                     "bare_s": plain, "ratio": plain / (total - sending),
                     "ratio_with_sync": plain / total})
        results.say(f"  round {r + 1}/{profile['rounds']}: island {tokens / (total - sending):,.0f}"
                    f" tokens/s, bare {tokens / plain:,.0f} tokens/s, ratio "
                    f"{rows[-1]['ratio']:.3f}, with sync {rows[-1]['ratio_with_sync']:.3f}")

    island_s = sum(r["island_s"] for r in rows)
    sync_s = sum(r["sync_s"] for r in rows)
    bare_s = sum(r["bare_s"] for r in rows)
    n_tokens = tokens * len(rows)
    out: dict[str, Any] = {
        "ratio": statistics.median(r["ratio"] for r in rows),
        "ratio_with_sync": statistics.median(r["ratio_with_sync"] for r in rows),
        "ratio_of_totals": bare_s / island_s,
        "ratio_with_sync_of_totals": bare_s / (island_s + sync_s),
        "island_tokens_per_s": n_tokens / island_s,
        "island_with_sync_tokens_per_s": n_tokens / (island_s + sync_s),
        "bare_tokens_per_s": n_tokens / bare_s,
        "sync_ms_per_step": 1000 * sync_s / (steps * len(rows)),
        "model_params": params, "model": profile["model"],
        "batch_size": profile["batch_size"], "tokens_per_step": island.tokens_per_step,
        "steps": steps * len(rows), "rounds": len(rows), "round_steps": steps,
        "inner_steps": steps, "fragments": config.sync.fragments, "codec": profile["codec"],
        "threads": torch.get_num_threads(), "per_round": rows,
    }
    bound = profile["bounds"]["ratio"]
    out["checks"] = {"island / bare tokens/s": results.check(out["ratio"], bound)}
    out["profile"] = "quick" if quick else "full"
    out["seconds"] = round(time.time() - started, 1)
    # A quick run keeps its own file, so it never hides the figures of the full one.
    path = results.write("overhead-quick" if quick else "overhead", out)

    print(results.table([
        {"loop": "bare", "tokens_per_s": out["bare_tokens_per_s"], "ratio_to_bare": 1.0},
        {"loop": "island", "tokens_per_s": out["island_tokens_per_s"],
         "ratio_to_bare": out["ratio"]},
        {"loop": "island + sync", "tokens_per_s": out["island_with_sync_tokens_per_s"],
         "ratio_to_bare": out["ratio_with_sync"]},
    ], ["loop", "tokens_per_s", "ratio_to_bare"]))
    print()
    print(results.checks_table(out["checks"]))
    print(f"\nmodel: {params:,} parameters, batch {profile['batch_size']} x "
          f"{config.model.block_size}, {out['steps']} steps per loop, sync "
          f"{out['sync_ms_per_step']:.3f} ms/step ({profile['codec']}, H={steps}, "
          f"P={config.sync.fragments}); ratios are medians of per-round ratios; "
          f"{out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])
