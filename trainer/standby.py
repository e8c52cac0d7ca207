"""python -m trainer.standby: a warm standby island, started by its host's pool manager.

It gets ready before anyone needs it: the interpreter is up, torch and the
project's modules are imported (trainer.runner and all it imports), and the
corpus and model the manager names (those of the last run the host served) are
open and built. Then it says "ready" on its stdout and waits for one claim on its
stdin, a JSON line from the manager:

    {"run", "island", "epoch", "island_key", "asked_at", "claimed_at", "redis_url",
     "dataplane_url", "log_path"}

(island_key: the hex key of that island's epoch, diloco.signing.island_key; redis_url:
the manager's Redis as the run's island user, syncd/acl.py: on stdin, never on its
command line). Until its claim it touches no Redis at all, so it holds no credential
of any run, nor the pool's.

It trains for that run, island and epoch and for nothing else: it never looks
for work of its own, and a claim whose epoch is no longer the island's current
one (a stale claim) is refused (exit code 3, no heartbeat sent). A claimed
standby's start-up counts from its claim (trainer/phases.py: its process and
imports phases are 0), and from then on it is trainer.runner's ProcessIsland.

The manager starts it at idle priority (SCHED_IDLE) where it may leave it, so a
refill never slows the islands that train; at its claim it takes the normal priority
back (trainer/priority.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time

import torch

from diloco.config import DataConfig, ModelConfig
from diloco.data import Corpus, corpus_key, run_corpus
from diloco.island import Model, build_model, model_shape
from diloco.model import GPT, GPTConfig
from diloco.tokenizer import vocab_of
from syncd.acl import island_store
from syncd.environment import data_dir
from syncd.malloc import give_back_heap, return_large_frees
from trainer.launch import exit_now
from trainer.phases import StartClock
from trainer.pool import check_claim
from trainer.priority import normal_priority
from trainer.runner import ProcessIsland, rss_bytes

log = logging.getLogger("archipelago.island")
READY_LINE = "ready"
STALE_EXIT = 3


def prepare(warm: dict) -> tuple[dict[tuple, Corpus], Model | None]:
    """Open the corpus (tokenized as the run tokenizes it) and build the model a standby
    was asked to have ready."""
    corpora = {}
    data = DataConfig(**{k: v for k, v in warm.get("data", {}).items() if v is not None})
    if warm.get("data") is not None:
        corpora[corpus_key(data)] = run_corpus(data, data_dir())
    # The run's model class and shape, a transformers model for a run of source hf, with
    # its tokenizer's vocabulary.
    model = (build_model(model_shape(ModelConfig(**warm["model"]), vocab_of(data)))
             if warm.get("model") else None)
    warm_up(model if model is not None else GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2,
                                                           block_size=16)))
    give_back_heap()  # the step's gradients and moments: an idle standby holds its model
    return corpora, model


def warm_up(model: Model) -> None:
    """One throwaway training step: torch imports much of itself lazily on the first
    optimizer and the first backward (most of a claimed standby's model phase before
    this), so a standby pays that before its claim. The step's changes
    do not matter: a claim's pull replaces every parameter."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    x = torch.zeros(1, model.config.block_size, dtype=torch.long)
    _, loss = model(x, x)
    loss.backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)


def redirect_output(log_path: str) -> None:
    """From the claim on, stdout and stderr go to the island's log, as a cold start's do."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", default="{}",
                        help='JSON {"data": {"path", "eval_fraction"}, "model": {...}}')
    args = parser.parse_args()
    torch.set_num_threads(1)  # several islands share a host's cores
    return_large_frees(keep_heap=True)
    corpora, model = prepare(json.loads(args.warm))
    idle_rss = rss_bytes()
    print(READY_LINE, flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return  # the manager let it go unclaimed
    claimed_at = time.time()
    normal_priority()
    claim = json.loads(line)
    redirect_output(claim["log_path"])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    store = island_store(claim["redis_url"], claim.get("dataplane_url") or claim["redis_url"],
                         claim["run"])
    active = store.is_active() and store.control.stop_requested() is None
    refused = check_claim(claim, active, store.epochs().get(claim["island"]))
    if refused:
        log.warning("standby %d refused its claim: %s", os.getpid(), refused)
        raise SystemExit(STALE_EXIT)
    clock = StartClock({"asked": claim.get("asked_at"), "launched": claimed_at,
                        "started": claimed_at, "imported": claimed_at})
    island = ProcessIsland(store, claim["island"], claim["epoch"], None, None, idle_rss,
                           clock=clock, corpora=corpora, model=model, warm=True,
                           key=bytes.fromhex(str(claim.get("island_key", ""))))

    def stop(signum: int, frame: object) -> None:
        island.stop()

    signal.signal(signal.SIGTERM, stop)
    log.info("island %s epoch %d of run %s starting on %s (warm standby %d, claimed "
             "%.3f s after it was asked for)", claim["island"], claim["epoch"], claim["run"],
             island.device, os.getpid(), claimed_at - (claim.get("asked_at") or claimed_at))
    exit_now(island.run())  # as the runner ends: no interpreter teardown with torch


if __name__ == "__main__":
    main()
