"""Memory and data-plane speed at real model sizes: `python -m bench scale [--quick]`.

It starts the real system the way `python -m webapp.start` does (its own control
Redis with an append-only file and its data plane with nothing on disk, each with a
maxmemory; syncd; a Celery worker per region whose island processes train) under
var/bench-scale, and trains one run per model size, from
about 1M to 113M parameters of the builtin GPT and then a Llama of the transformers
library of 113.7M (model.source hf, diloco/presets.py LLAMA_114M, built from its config
with random weights, nothing fetched), each for a fixed number of outer rounds (P = 4, H = 8,
tau = 1, K = 2, codec none, grace 0 so a round merges when its quorum is in), with
syncd started anew for each size. Every second it samples the two Redis'
used_memory, syncd's resident memory and each island's (the pid each island heartbeats).

Per size it reports, with B the fp32 model bytes (4 x parameters):
- peak Redis memory (each Redis's used_memory_peak or its sampled peak above its
  used_memory when the size started, summed over the two: an upper bound of their
  peak together) (the sizes share one Redis: what earlier sizes
  left behind is subtracted), syncd's peak RSS
  above its idle RSS (VmHWM; idle: syncd serving no run) and an island's peak RSS
  above its idle RSS (after imports, before the run spec is read; the island
  heartbeats it), each over B;
- growth: over the rounds from 3 on, each series right after each merge event (the
  first sample after it) fitted against the round by least squares, the fitted
  rise over the rounds relative to its start (flat is 0; of Redis the control
  Redis's: what the data plane holds is update messages in flight, whose number when
  a merge lands is timing, and their client buffers, bounded below); the second
  half's peak
  over the first half's; and the slope of each series over the second half of the
  run in MB per minute;
- ingest-to-publish latency per merged fragment (syncd's merge events: from the pass
  that read the update closing the round to the merge committed), pull latency
  (reading, checking and mixing a global fragment, from the islands' heartbeats) and
  merged fragments per second, each also per MB of fragment;
- the update messages on the data plane: their peak (at most one per upload slot,
  each the largest fragment's update and its header) and what is left of them once
  the run ended (nothing);
- the append-only file's size and the system folder's, and Redis's memory once the
  run ended and freed its keys;
- the islands syncd marked lost (its `island_lost` events): the run has no faults, so
  every one is a false death.

A sample whose Redis reads time out (the client's 5 s, on a loaded machine) is left
out and counted (`samples_timed_out`).

It writes bench/results/scale.json (scale-quick.json with --quick: the two smallest
sizes), with each size's seconds from its syncd's start to its islands' exit and
those of the sizes of at least 100M parameters apart (`wall_s_at_100m`), and
scale.html (memory over time per size), prints a table, and exits
non-zero when a target is missed. `--minutes N` instead trains the top builtin size
for N minutes with 4 islands and writes scale-long.json. `--device cuda` trains the
islands on the GPU and adds a size of about 1.2B parameters.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeout

from bench import results
from bench.system import ROOT, BenchSystem
from diloco.presets import LLAMA_114M

HOME = ROOT / "var" / "bench-scale"
REGIONS = ("us-east", "us-west")
MIB = 1 << 20
SIZES: list[dict[str, Any]] = [
    {"label": "1M", "n_layer": 2, "n_embd": 192, "n_head": 4, "islands": 4, "batch": 4,
     "block": 64},
    {"label": "11M", "n_layer": 6, "n_embd": 384, "n_head": 6, "islands": 4, "batch": 4,
     "block": 64},
    {"label": "57M", "n_layer": 8, "n_embd": 768, "n_head": 12, "islands": 4, "batch": 2,
     "block": 128},
    # M = 4 at the top size too: the memory of Redis and syncd must not grow
    # with the islands, which two cannot show.
    {"label": "113M", "n_layer": 16, "n_embd": 768, "n_head": 12, "islands": 4, "batch": 2,
     "block": 128},
]
# The Llama of the transformers library at the top size (the same islands and batch).
HF_SIZES: list[dict[str, Any]] = [
    {"label": "llama-114M", "hf_config": json.dumps(LLAMA_114M), "islands": 4, "batch": 2,
     "block": 128},
]
# On a GPU (--device cuda) the sizes go on to about 1.2B parameters (2 islands).
GPU_SIZES: list[dict[str, Any]] = [
    {"label": "1.2B", "n_layer": 24, "n_embd": 2048, "n_head": 16, "islands": 2, "batch": 4,
     "block": 256},
]
ROUNDS = 8  # outer rounds per size
WALL_FROM_PARAMS = 100_000_000  # the sizes whose seconds the results state apart
H, P = 8, 4
TARGETS = {"redis": (3.5, 64 * MIB, 10e6), "syncd": (5.0, 0, 10e6), "island": (7.0, 0, 50e6)}
MAX_LOWS_RISE = 0.05
HEADER_ALLOWANCE = 16 * 1024  # an update message's header and tag, at most (about 1 KiB)
SAMPLE_S = 1.0


def run_config(size: dict[str, Any], corpus: Path, total_tokens: int, device: str = "cpu"
               ) -> dict[str, Any]:
    islands = [{"name": f"{REGIONS[i % 2].split('-')[1]}-{i // 2}", "region": REGIONS[i % 2],
                "batch_size": size["batch"]} for i in range(size["islands"])]
    model = ({"source": "hf", "hf_config": size["hf_config"]} if "hf_config" in size else
             {"n_layer": size["n_layer"], "n_embd": size["n_embd"], "n_head": size["n_head"]})
    return {
        "model": {**model, "block_size": size["block"]},
        "data": {"path": str(corpus)},
        "sync": {"inner_steps": H, "fragments": P, "overlap_steps": 1, "min_quorum": 2,
                 "grace_gamma": 0.0, "compression": "none", "downlink_compression": "none"},
        "optim": {"warmup_steps": 4},
        "eval": {"tokens": 1024, "interval_steps": 10**6},
        # A step of the top size takes seconds on a shared CPU core.
        "liveness": {"heartbeat_timeout_s": 120.0},
        "checkpoint": {"interval_s": 60.0, "keep": 2},
        "budget": {"total_tokens": total_tokens},
        "train": {"device": device},
        "islands": islands,
    }


def size_config(size: dict[str, Any]) -> Any:
    """The run config of a size, parsed (diloco.config.RunConfig)."""
    from diloco.config_parse import parse_config

    return parse_config(run_config(size, Path(""), 10**6), list(REGIONS))


def params_of(size: dict[str, Any]) -> int:
    """The size's parameter count, from its shapes (diloco.sizes; no model is built)."""
    from diloco.sizes import estimate

    return estimate(size_config(size)).params


def estimate_of(size: dict[str, Any]) -> dict[str, int]:
    """What diloco.sizes estimates for this size: totals per part and the activations
    (an hf model's logits and their gradient with them)."""
    from diloco.sizes import estimate

    est = estimate(size_config(size))
    island = max(est.islands.values(), key=lambda need: need.total)
    return {"redis": est.redis.total, "syncd": est.syncd.total, "island": island.total,
            "activations": island.parts["activations"] + island.parts.get("logits", 0)}


def messages_bound(size: dict[str, Any]) -> int:
    """The most bytes of update messages the data plane may hold at once: one per upload
    slot, each the largest fragment's update (diloco.sizes) and its header."""
    from diloco.sizes import estimate

    config = size_config(size)
    return (estimate(config).redis.parts["update messages"]
            + config.sync.upload_slots * HEADER_ALLOWANCE)


def rss(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of a process in bytes; None once it is gone. From /proc, since
    psutil (7.2) gives no peak RSS (VmHWM) on Linux."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                      .splitlines() if ":" in line)
    except (FileNotFoundError, ProcessLookupError):
        return None
    if "VmRSS" not in fields:  # a zombie: it has let go of its memory
        return None
    return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)


def failed_islands(log_dir: Path) -> list[str]:
    """The islands whose process failed (their supervisor's line in the island log),
    each with the log's last line: the size does not fit, say."""
    failed = []
    for log in sorted(log_dir.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        if any("ended (failed)" in line for line in lines):
            last = next((line for line in reversed(lines) if "Error" in line), lines[-1])
            failed.append(f"island {log.stem} failed: {last}")
    return failed


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def slope_mb_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, bytes) points, in MB per minute."""
    if len(points) < 3:
        return 0.0
    ts, vs = [t for t, _ in points], [v for _, v in points]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    var = sum((t - mt) ** 2 for t in ts)
    return 0.0 if var == 0 else sum((t - mt) * (v - mv) for t, v in points) / var * 60 / 1e6


def steady(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples from round 3 on, up to the last round before the run's end (its
    final evaluation and checkpoint are not growth)."""
    last = max((s["round"] for s in samples), default=0)
    return [s for s in samples if 3 <= s["round"] < last]


def post_merge_lows(samples: list[dict[str, Any]], merge_times: list[float], series: str
                    ) -> list[tuple[int, float]]:
    """(round, value) of `series` right after each merge: the first sample taken at or
    after the merge's time (samples' `time` and merge times on one clock), from the
    steady rounds (`steady`); a sample that follows several merges counts once."""
    points = sorted((s for s in steady(samples) if s.get(series) is not None),
                    key=lambda s: s["time"])
    taken: dict[int, tuple[int, float]] = {}
    for merged in sorted(merge_times):
        after = next((n for n, s in enumerate(points) if s["time"] >= merged), None)
        if after is not None:
            taken[after] = (points[after]["round"], points[after][series])
    return [taken[n] for n in sorted(taken)]


def lows_rise(samples: list[dict[str, Any]], merge_times: list[float], series: str) -> float:
    """How much the post-merge lows (post_merge_lows) rise over the steady rounds: the
    least-squares line of value against round, its rise from the first round to the
    last over its value at the first (0: flat; below 0: falling)."""
    lows = post_merge_lows(samples, merge_times, series)
    rounds = [r for r, _ in lows]
    if len(set(rounds)) < 2:
        return 0.0
    mr, mv = statistics.fmean(rounds), statistics.fmean(v for _, v in lows)
    slope = sum((r - mr) * (v - mv) for r, v in lows) / sum((r - mr) ** 2 for r in rounds)
    start = mv + slope * (min(rounds) - mr)
    return slope * (max(rounds) - min(rounds)) / start if start > 0 else 0.0


def peak_above_before(before: int, sampled: list[int], peak_stat: int, peak_stat_before: int
                      ) -> int:
    """A size's peak Redis memory of its own: the larger of Redis's used_memory_peak (when
    this size raised it above `peak_stat_before`) and the sampled used_memory, less
    `before`, the used_memory when the size started (what earlier sizes left behind)."""
    peak = max(peak_stat if peak_stat > peak_stat_before else 0, max(sampled, default=0))
    return max(peak - before, 0)


def message_bytes(data: Any, pattern: str) -> int:
    """The bytes of the update messages the data plane holds now: the chunks of every
    key matching `pattern` (the run's `blob:*`)."""
    keys = list(data.scan_iter(match=pattern, count=1000))
    pipe = data.pipeline(transaction=False)
    for key in keys:
        pipe.strlen(key)
    return sum(pipe.execute()) if keys else 0


def halves_peak_ratio(samples: list[dict[str, Any]], series: str) -> float:
    """From round 3 on, the second half's peak over the first half's (by time)."""
    points = [s[series] for s in steady(samples) if s.get(series) is not None]
    if len(points) < 2:
        return 1.0
    half = len(points) // 2
    return max(points[half:]) / max(points[:half])


def run_size(system: BenchSystem, size: dict[str, Any], corpus: Path, rounds: int,
             minutes: float | None = None, device: str = "cpu") -> dict[str, Any]:
    from syncd import lease
    from syncd.connection import connect
    from syncd.store import RunStore
    from webapp.processes import wait_for
    from webapp.runs.lifecycle import create_run, start_run, stop_run
    from webapp.runs.models import Event

    client = connect(system.redis_url)
    redises = [client] + ([connect(system.dataplane_url)] if system.dataplane_url else [])
    system.start_syncd()
    wait_for(lambda: lease.members_alive(client), 120, "syncd serving", 0.2)
    time.sleep(2.0)
    syncd_pid = system.pid("syncd")
    syncd_idle = rss(syncd_pid)[0]
    params = params_of(size)
    fp32 = 4 * params
    round_tokens = H * size["islands"] * size["batch"] * size["block"]
    budget = 10**12 if minutes else rounds * round_tokens
    config = run_config(size, corpus, budget, device)
    redis_before = [int(r.info("memory")["used_memory"]) for r in redises]
    peak_before = [int(r.info("memory")["used_memory_peak"]) for r in redises]
    run = create_run(name=f"scale {size['label']}", mode="decoupled", config=config, user=None)
    store = RunStore(client, run.pk)
    results.say(f"{size['label']}: {params / 1e6:.1f}M parameters, {size['islands']} islands, "
                f"run {run.pk}")
    start_run(run, by=None)
    names = [i["name"] for i in config["islands"]]
    samples: list[dict[str, Any]] = []
    idle: dict[str, int] = {}
    hwm: dict[str, int] = {}
    pulls: dict[str, tuple[int, float]] = {}
    started = time.monotonic()
    deadline = started + (minutes * 60 if minutes else 3600)
    syncd_hwm = 0
    timed_out = 0
    while True:
        died = system.processes.check() + failed_islands(system.home / "logs" / f"run-{run.pk}")
        if died:
            raise RuntimeError("; ".join(died))
        try:
            status = store.status() or {}
            beats = store.signals.heartbeats()
            memory = [r.info("memory") for r in redises]
            in_flight = message_bytes(redises[-1], store.key("blob", "*"))
        except RedisTimeout:  # a Redis slow to answer on a loaded machine: no sample
            timed_out += 1
            if time.monotonic() > deadline:
                raise
            continue
        clients = sum(int(m.get("mem_clients_normal", 0)) for m in memory)
        sample = {"t": round(time.monotonic() - started, 2), "time": time.time(),
                  "round": status.get("outer_steps", 0),
                  "redis": sum(int(m["used_memory"]) for m in memory),
                  "redis_each": [int(m["used_memory"]) for m in memory],
                  # what of it is client buffers (replies being sent, commands coming in)
                  "redis_clients": clients,
                  # the control Redis alone: what it keeps could grow from round to round
                  "redis_control": int(memory[0]["used_memory"]),
                  # the update messages on the data plane, which the upload slots bound
                  "redis_messages": in_flight}
        syncd_now = rss(syncd_pid)
        if syncd_now:
            sample["syncd"] = syncd_now[0]
            syncd_hwm = max(syncd_hwm, syncd_now[1])
        for name in names:
            beat = beats.get(name)
            if beat and beat.idle_rss:
                idle.setdefault(name, beat.idle_rss)
            if beat and beat.pulls:
                pulls[name] = (beat.pulls, beat.pull_s)
            now = rss(beat.pid) if beat and beat.pid else None
            if now:
                sample[name] = now[0]
                hwm[name] = max(hwm.get(name, 0), now[1])
        samples.append(sample)
        if "outcome" in status:
            break
        if time.monotonic() > deadline:
            if not minutes:
                raise TimeoutError(f"size {size['label']} did not finish its rounds in time")
            stop_run(run, by=None)
            break
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - started
    # What is left after the end is measured once the run has ended and freed its keys:
    # a stopped run first merges what its islands flush, then saves its checkpoint.
    wait_for(lambda: not store.is_active(), 600, "the run to end and free its keys", 0.5)
    wait_for(lambda: all(rss(b.pid) is None for b in store.signals.heartbeats().values()
                         if b.pid), 120, "the islands to exit", 0.5)
    redis_peak = sum(peak_above_before(redis_before[i], [s["redis_each"][i] for s in samples],
                                       int(r.info("memory")["used_memory_peak"]),
                                       peak_before[i]) for i, r in enumerate(redises))
    after_end = sum(int(r.info("memory")["used_memory"]) for r in redises)
    messages_after_end = message_bytes(redises[-1], store.key("blob", "*"))
    merges = [e.detail for e in Event.objects.filter(run=run, kind="merge")]
    lost = [{"island": e.island.name if e.island_id else None, "time": e.time.timestamp(),
             **e.detail} for e in Event.objects.filter(run=run, kind="island_lost")]
    merge_times = sorted(e.time.timestamp() for e in Event.objects.filter(run=run, kind="merge"))
    fragment_mb = fp32 / P / 1e6
    latencies = [d["latency_s"] for d in merges if "latency_s" in d]
    pull_means = [s / n for n, s in pulls.values() if n]
    island_peak = max((hwm[n] - idle[n] for n in names if n in hwm and n in idle), default=0)
    second_half = [s for s in samples if s["t"] >= wall / 2]
    series = ["redis", "syncd", *names]
    out = {
        "label": size["label"], "params": params, "fp32_bytes": fp32,
        "islands": size["islands"], "batch": f"{size['batch']} x {size['block']}",
        "rounds": samples[-1]["round"], "wall_s": round(wall, 1),
        "redis_peak_bytes": redis_peak, "redis_peak_ratio": round(redis_peak / fp32, 3),
        "redis_clients_peak_ratio": round(max(s["redis_clients"] for s in samples) / fp32, 3),
        "syncd_idle_bytes": syncd_idle, "syncd_peak_above_idle_bytes": syncd_hwm - syncd_idle,
        "syncd_peak_ratio": round((syncd_hwm - syncd_idle) / fp32, 3),
        "island_idle_bytes": statistics.median(idle.values()) if idle else None,
        "island_peak_above_idle_bytes": island_peak,
        "island_peak_ratio": round(island_peak / fp32, 3),
        "estimate_bytes": estimate_of(size),
        "growth": round(max(halves_peak_ratio(samples, s) for s in series), 4),
        # Redis's lows are the control Redis's: the data plane holds update messages in
        # flight (how many when a merge lands is timing) and their client buffers, which
        # its checks bound apart (at most one message per upload slot, none left after
        # the end), not growth.
        "lows_rise": round(max(lows_rise(samples, merge_times, s)
                               for s in ["redis_control", *series[1:]]), 4),
        "lows_rise_each": {s: round(lows_rise(samples, merge_times, s), 4)
                           for s in ["redis", "redis_control", *series[1:]]},
        "redis_messages_peak_bytes": max(s["redis_messages"] for s in samples),
        "redis_messages_bound_bytes": messages_bound(size),
        "slope_mb_per_min": {s: round(slope_mb_per_min(
            [(p["t"], p[s]) for p in second_half if s in p]), 2) for s in series},
        "merged_fragments": len(merges),
        "ingest_to_publish_s": round(statistics.median(latencies), 4) if latencies else None,
        "ingest_to_publish_s_per_mb": round(statistics.median(latencies) / fragment_mb, 5)
        if latencies else None,
        "pull_s": round(statistics.median(pull_means), 4) if pull_means else None,
        "pull_s_per_mb": round(statistics.median(pull_means) / fragment_mb, 5)
        if pull_means else None,
        "merged_fragments_per_s": round((len(merge_times) - 1) / (merge_times[-1]
                                        - merge_times[0]), 3) if len(merge_times) > 2 else None,
        "islands_lost": lost,
        "samples_timed_out": timed_out,
        "dataplane": system.dataplane_url is not None,
        "aof_bytes": folder_bytes(system.home / "redis"),
        "system_folder_bytes": folder_bytes(system.home),
        "redis_before_bytes": sum(redis_before),
        "redis_after_end_bytes": after_end,
        "redis_after_end_above_before_bytes": after_end - sum(redis_before),
        "redis_messages_after_end_bytes": messages_after_end,
        "samples": samples,
    }
    if out["merged_fragments_per_s"] is not None:
        out["merged_mb_per_s"] = round(out["merged_fragments_per_s"] * fragment_mb, 2)
    system.stop_process("syncd")
    return out


def checks(sizes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for size in sizes:
        for part, (ratio, extra, from_params) in TARGETS.items():
            if size["params"] < from_params:
                continue
            bound = ratio + extra / size["fp32_bytes"]
            out[f"{size['label']} {part} peak / B"] = results.check(
                size[f"{part}_peak_ratio"], round(bound, 3), at_least=False)
        out[f"{size['label']} post-merge lows rise"] = results.check(
            size["lows_rise"], MAX_LOWS_RISE, at_least=False)
        out[f"{size['label']} update messages in flight, bytes"] = results.check(
            size["redis_messages_peak_bytes"], size["redis_messages_bound_bytes"],
            at_least=False)
        out[f"{size['label']} update messages left after the end"] = results.check(
            size["redis_messages_after_end_bytes"], 0, at_least=False)
        out[f"{size['label']} rounds"] = results.check(size["rounds"], 3)
        out[f"{size['label']} islands marked lost (no faults)"] = results.check(
            len(size["islands_lost"]), 0, at_least=False)
    return out


def report_html(sizes: list[dict[str, Any]]) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=len(sizes), cols=1, subplot_titles=[
        f"{s['label']}: {s['params'] / 1e6:.1f}M parameters, B = {s['fp32_bytes'] / MIB:.0f} MiB"
        for s in sizes])
    for row, size in enumerate(sizes, start=1):
        names = sorted({k for s in size["samples"] for k in s}
                       - {"t", "time", "round", "redis_each"})
        for name in names:
            points = [s for s in size["samples"] if name in s]
            fig.add_trace(go.Scatter(x=[p["t"] for p in points],
                                     y=[p[name] / size["fp32_bytes"] for p in points],
                                     name=f"{size['label']} {name}", mode="lines"), row=row, col=1)
        fig.update_yaxes(title_text="memory / B", row=row, col=1)
    fig.update_xaxes(title_text="seconds since start")
    fig.update_layout(height=320 * len(sizes), title="bench scale: memory over time")
    return fig.to_html(include_plotlyjs=True)


def main(quick: bool = False, minutes: float | None = None, device: str = "cpu") -> int:
    from bench.goodput import make_corpus

    gpu = GPU_SIZES if device == "cuda" else []
    ladder = SIZES + HF_SIZES + gpu
    sizes = [(SIZES + gpu)[-1]] if minutes else ladder[:2] if quick else ladder
    name = "scale-long" if minutes else "scale-quick" if quick else "scale"
    from webapp.processes import redis_maxmemory_mb

    system = BenchSystem(HOME, list(REGIONS), appendonly=True,
                         maxmemory_mb=redis_maxmemory_mb(), dataplane=True)
    rows = []
    started = time.monotonic()
    try:
        system.setup_django()
        corpus = make_corpus(HOME / "corpus.txt")
        system.start_workers(concurrency=max(s["islands"] for s in sizes) // len(REGIONS))
        for size in sizes:
            began = time.monotonic()
            rows.append(run_size(system, size, corpus, ROUNDS, minutes, device))
            rows[-1]["seconds"] = round(time.monotonic() - began, 1)
    finally:
        system.stop()
    found = checks(rows)
    path = results.write(name, {"sizes": rows, "checks": found, "h": H, "p": P,
                                "rounds": ROUNDS, "minutes": minutes, "device": device,
                                "seconds": round(time.monotonic() - started, 1),
                                "wall_s_at_100m": {r["label"]: r["seconds"] for r in rows
                                                   if r["params"] >= WALL_FROM_PARAMS}})
    (results.RESULTS / f"{name}.html").write_text(report_html(rows))
    columns = ["label", "params", "islands", "rounds", "seconds", "redis_peak_ratio",
               "syncd_peak_ratio", "island_peak_ratio", "growth", "lows_rise",
               "ingest_to_publish_s", "pull_s", "merged_fragments_per_s"]
    print(results.table(rows, columns))
    print(results.checks_table(found))
    results.say(f"wrote {path}")
    return results.exit_code(found)
