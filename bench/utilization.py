"""Island utilization: `python -m bench utilization [--quick]`.

One real island process (`python -m trainer.runner`) trains GPT-2 small's shape
(85.6M parameters; a 6M model with --quick) through its own two Redis and syncd
over an emulated 2 Gb/s link with tau = 1, int4 up and int8 down; `value` is its
steps x the fault-free step time (a bare PyTorch loop of the same model and batch in
a process of its own, before and after the run) / their wall time, judged against
0.95 from 85M parameters (`island_utilization`). `python -m bench dataplane` runs
it after its configs, into the same JSON; alone it writes
bench/results/utilization.json (utilization-quick.json with --quick), prints a
table, and exits non-zero when the target is missed.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench import results
from bench.goodput import make_corpus
from bench.syncd_process import RUN_ID, start_redis, syncd_main
from bench.system import ROOT
from diloco.config_parse import parse_config
from diloco.model import GPT, GPTConfig
from diloco.signing import island_key
from syncd.connection import connect
from syncd.records import Heartbeat
from syncd.store import RunStore
from trainer.launch import (
    DATAPLANE_URL_ENV,
    ISLAND_KEY_ENV,
    REDIS_URL_ENV,
    island_command,
    island_env,
)
from trainer.link import POLL_S
from webapp.processes import wait_for

HOME = ROOT / "var" / "bench-utilization"
TARGET = 0.95  # the simulator's figure for the setting is 1.0
FROM_PARAMS = 85_000_000  # judged from GPT-2 small's shape (85.6M) up
ISLAND = "island-0"
BATCH = 2
LINK = {"bandwidth_gbps": 2.0, "latency_ms": 20.0}
SETTINGS: dict[str, dict[str, Any]] = {
    # GPT-2 small's shape (webapp/runs/presets.py gpt2_small): 85.6M parameters.
    "full": {"model": {"n_layer": 12, "n_embd": 768, "n_head": 12, "block_size": 256},
             "inner_steps": 8, "fragments": 4, "overlap_steps": 1,
             "outer_steps": 4, "bare_s": 60.0, "timeout_s": 3600.0},
    "quick": {"model": {"n_layer": 4, "n_embd": 320, "n_head": 8, "block_size": 128},
              "inner_steps": 8, "fragments": 4, "overlap_steps": 1,
              "outer_steps": 3, "bare_s": 10.0, "timeout_s": 900.0},
}
COLUMNS = ["params", "link_gbps", "overlap_steps", "value", "bare_step_s",
           "island_step_s", "steps", "wall_s", "pull_wait_s", "late_globals"]


def utilization_config(setting: dict[str, Any], corpus: str) -> dict[str, Any]:
    """The utilization phase's run: one island on an emulated 2 Gb/s, 20 ms link, int4
    updates up and int8 differences down (the real-size codecs of
    webapp/runs/presets.py), K = 1, on the CPU."""
    return {
        "model": setting["model"],
        "data": {"path": corpus},
        "sync": {"inner_steps": setting["inner_steps"], "fragments": setting["fragments"],
                 "overlap_steps": setting["overlap_steps"], "min_quorum": 1,
                 "grace_gamma": 0.0, "compression": "int4", "downlink_compression": "int8"},
        "train": {"device": "cpu"},
        "eval": {"tokens": 256, "interval_steps": 10**6},
        "liveness": {"heartbeat_timeout_s": 3600.0},
        "checkpoint": {"interval_s": 86400},
        "budget": {"total_tokens": 10**13},
        "islands": [{"name": ISLAND, "region": "us-east", "batch_size": BATCH,
                     **LINK}],
    }


def bare_step_s(model: dict[str, int], corpus: Path, seconds: float) -> float:
    """Seconds per step of one bare loop (`python -m bench.efficiency`, whose
    bench.overhead.BareLoop steps the island's model class from the same initial
    weights on the same batches, with the same clipping and AdamW, torch on one thread
    as an island's, and sends nothing), in a process of a session of its own as an
    island's, warmed by 3 steps and then stepped for `seconds`."""
    spec = json.dumps({"model": model, "corpus": str(corpus), "batch_size": BATCH})
    loop = subprocess.Popen([sys.executable, "-m", "bench.efficiency", spec], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        if (line := loop.stdout.readline().strip()) != "ready":
            raise RuntimeError(f"the bare loop said {line!r}, not ready")
        loop.stdin.write(f"{seconds}\n")
        loop.stdin.flush()
        done = json.loads(loop.stdout.readline())
    finally:
        loop.kill()
        loop.wait()
    return done["seconds"] / done["steps"]


def window_beats(store: RunStore, island: subprocess.Popen, start: int, length: int,
                 timeout_s: float, log: Path) -> tuple[Heartbeat, Heartbeat]:
    """The island's first heartbeat that shows step `start` or later, and its first that
    shows `length` steps more than that one."""
    deadline = time.monotonic() + timeout_s
    beats: list[Heartbeat] = []
    for _ in range(2):
        step = beats[0].step + length if beats else start
        while (beat := store.signals.heartbeats().get(ISLAND)) is None or beat.step < step:
            if island.poll() is not None:
                raise RuntimeError(f"the island ended with code {island.returncode} before "
                                   f"step {step}; see {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the island did not reach step {step} in {timeout_s:g} s;"
                                   f" see {log}")
            time.sleep(POLL_S)
        beats.append(beat)
    return beats[0], beats[1]


def utilization_between(first: Heartbeat, last: Heartbeat, bare_s: float) -> dict[str, Any]:
    """Island utilization between two heartbeats of one island: the steps between them
    times the bare step time, over the wall time between them (1.0: the island steps as
    fast as bare PyTorch, its sends, pulls and mixes hidden); with what the island's
    training thread waited for pulls (pull_wait_s), the merged fragments it mixed after
    their tau overlap steps (late_globals), its pulls and its backpressure waits between
    the same heartbeats.

    Raises:
        ValueError: no step or no time between the heartbeats, or no bare step time.
    """
    steps, wall_s = last.step - first.step, last.time - first.time
    if steps <= 0 or wall_s <= 0 or bare_s <= 0:
        raise ValueError(f"utilization needs steps, wall time and a bare step time above 0, "
                         f"got {steps} steps in {wall_s:g} s at {bare_s:g} s a step")
    return {"value": round(steps * bare_s / wall_s, 4), "steps": steps,
            "wall_s": round(wall_s, 3), "island_step_s": round(wall_s / steps, 4),
            "pull_wait_s": round(last.pull_wait_s - first.pull_wait_s, 4),
            "late_globals": last.late_globals - first.late_globals,
            "pulls": last.pulls - first.pulls,
            "backpressure_wait_s": round(last.backpressure_wait_s - first.backpressure_wait_s,
                                         4)}


def island_utilization(setting: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Island utilization = steps x fault-free step time / wall time, of a real island.

    One island (M = 1): on a host of two cores its training thread (torch on one thread,
    as every island's) can have a core while syncd, both Redis, the bench and the
    island's link and downloads threads use the other, so what the figure loses is the
    system's own cost; two islands would take both cores and measure syncd taking
    turns with them instead.

    - fault-free step time: a bare loop (bare_step_s) before the run and again after
      it, in processes of their own with nothing else running, the mean of the two:
      a bound not computed from the result it judges;
    - the run: its own two Redis and syncd in a process of its own as run_one starts
      them (a RunSync ticked in a loop, torch on one thread as syncd's default), the
      spec of utilization_config, and the island as its supervisor starts it
      (`python -m trainer.runner`, with its Redis URLs and key in its environment);
    - the window: from the island's first heartbeat that shows step H or later (its
      first outer step done: AdamW's state and the first sends are warm, as the bare
      loop's 3 warm-up steps) to its first heartbeat that shows H x outer_steps steps
      more, so the window holds whole outer steps (any H steps in a row send each
      fragment once, and pull and mix it). A heartbeat goes out within about a quarter
      second of the step it shows, at both ends alike (a model of 85M beats after each
      of its steps; a tiny one steps faster than it beats). Then the island is stopped
      with SIGTERM (it ends its step, saves its cursor and exits 0).
    """
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    corpus = make_corpus(folder / "corpus.txt")
    config = utilization_config(setting, str(corpus))
    parse_config(config, ["us-east"])  # a wrong setting fails here, not in the island
    with torch.device("meta"):
        params = GPT(GPTConfig(**setting["model"])).num_params()
    h = setting["inner_steps"]
    bare = [bare_step_s(setting["model"], corpus, setting["bare_s"])]
    redis_process, url = start_redis(folder / "control", appendonly=True)
    data_process, data_url = start_redis(folder / "dataplane")
    ctx = mp.get_context("spawn")
    stop, busy_s, syncd_out = ctx.Event(), ctx.Value("d", 0.0), ctx.Queue()
    syncd = island = None
    log = folder / "island.log"
    try:
        client = connect(url)
        store = RunStore(client, RUN_ID)
        secret = os.urandom(16).hex()
        store.put_spec("decoupled", config, secret)
        store.set_epoch(ISLAND, 1)
        syncd = ctx.Process(target=syncd_main, name="syncd",
                            args=(url, data_url, str(folder / "checkpoints"), stop, busy_s,
                                  syncd_out))
        syncd.start()
        wait_for(lambda: len(store.globals.versions()) >= setting["fragments"]
                 or not syncd.is_alive(),
                 600, "syncd publishing version 0")
        if not syncd.is_alive():
            raise RuntimeError(f"syncd ended with code {syncd.exitcode}")
        key = island_key(bytes.fromhex(secret), ISLAND, 1)
        env = island_env({**os.environ, REDIS_URL_ENV: url, DATAPLANE_URL_ENV: data_url,
                          ISLAND_KEY_ENV: key.hex()})
        with log.open("wb") as out:
            island = subprocess.Popen(island_command(int(RUN_ID), ISLAND, 1),
                                      cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        first, last = window_beats(store, island, h, h * setting["outer_steps"],
                                   setting["timeout_s"], log)
        island.terminate()
        if island.wait(timeout=120) != 0:
            raise RuntimeError(f"the island exited with code {island.returncode} on SIGTERM;"
                               f" see {log}")
        stop.set()
        merges = len(syncd_out.get(timeout=120)["merges"])
        client.close()
    finally:
        if island is not None and island.poll() is None:
            island.kill()
            island.wait()
        stop.set()
        if syncd is not None:
            syncd.join(timeout=30)
            if syncd.is_alive():
                syncd.kill()
        for process in (redis_process, data_process):
            process.terminate()
            process.wait(timeout=30)
    bare.append(bare_step_s(setting["model"], corpus, setting["bare_s"]))
    shutil.rmtree(folder, ignore_errors=True)
    return {"params": params, "islands": 1, "batch_size": BATCH, "link_gbps":
            LINK["bandwidth_gbps"], "latency_ms": LINK["latency_ms"],
            "inner_steps": h, "fragments": setting["fragments"],
            "overlap_steps": setting["overlap_steps"], "codecs": {"up": "int4", "down": "int8"},
            **utilization_between(first, last, statistics.fmean(bare)),
            "bare_step_s": round(statistics.fmean(bare), 4),
            "bare_step_s_runs": [round(b, 4) for b in bare], "merges": merges,
            "target": TARGET}


def checks(utilization: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The target, for a model of at least FROM_PARAMS parameters."""
    if utilization["params"] < FROM_PARAMS:
        return {}
    return {"island utilization": results.check(utilization["value"], TARGET)}


def main(quick: bool = False) -> int:
    name = "quick" if quick else "full"
    started = time.time()
    u = island_utilization(SETTINGS[name], HOME)
    out = {"profile": name, "utilization": u, "checks": checks(u),
           "load_average": os.getloadavg(), "seconds": round(time.time() - started, 1)}
    path = results.write(f"utilization{'-quick' if quick else ''}", out)
    print(results.table([u], COLUMNS))
    print(f"\n{out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])
