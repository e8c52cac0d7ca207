"""Reintegration on the real system: `python -m bench rejoin [--quick]`.

It starts Archipelago on this machine with state of its own under
var/bench-rejoin (Redis, SQLite, syncd, a Celery worker per region), then, in
one invocation, twice over:

- warm: a pool manager per region (trainer/pool_manager.py) keeping one warm
  standby, as many as each region's islands;
- cold: the pool managers stopped, so every start and rejoin is today's cold
  start (a task on the region's queue, a new interpreter).

In each, it creates and starts the 4-island run (one island per region) a few
times, timing create to all islands training, and keeps the last one for the
cycles: `cycles` kill-and-rejoin cycles, their kills at least GAP_S apart, one
island after the other. Odd cycles are an operator's: SIGKILL of the island
process from outside (a crash: no command, the supervisor sees the exit) and a
rejoin by an operator. Even cycles are the chaos driver's two calls
(syncd/chaos_driver.py), made here so that they keep the spacing: a "kill"
command to the island's supervisor, then membership.rejoin_island with no actor.
A warm cycle whose rejoin found its region's pool empty (its rejoin event says
warm false) counts as cold.

Per cycle, from the run's own records: SIGKILL to `island_lost` (the SIGKILL's
moment is the kill here or, for a command, the death report's), rejoin to the
first inner step (syncd's rejoin event, with the phases), rejoin to the first
merge that takes an update of the island's new epoch (the merge event's
`epochs`), checked against 1 s plus a fragment's cadence (H steps at the K-th
fastest island's fault-free step time), not against the merge gaps of the run.
Per mode: p50 and p95 of
each, and of create to all training. It writes bench/results/rejoin.json
(rejoin-quick.json with --quick), prints the table and the checks against the
targets, and exits non-zero when one is missed.

`python -m bench rejoin --preset gpt2_small` is the rejoin at a real size:
the preset's run (its parameters, its codecs, two islands over emulated 2 Gb/s
links) with batch 1, so that steps are short on this machine, and a warm pool
per region; REAL_SIZE_CYCLES operator kills and rejoins, each timed from the rejoin
to the first inner step with its phases. What the rejoin costs is that time less
one inner step, which the island would have taken anyway (its step time before the
kill, from its heartbeats: `step_time_before`); it is judged
against the island's emulated wire time for the pull of every fragment's full
message (diloco.wan.transfer_time of the bytes the rejoin reads) plus 1 s. It
writes bench/results/rejoin-<preset>.json.
"""

from __future__ import annotations

import itertools
import os
import signal
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import results
from bench.goodput import make_corpus, wait_islands_stopped
from bench.system import ROOT, BenchSystem
from diloco.uptime import fragment_cadence
from syncd.environment import text
from syncd.records import Heartbeat

HOME = ROOT / "var" / "bench-rejoin"
REGIONS = ("us-east", "us-west", "eu-west", "ap-south")
PROFILES = {"full": {"cycles": 20, "creates": 3}, "quick": {"cycles": 5, "creates": 2}}
REAL_SIZE_CYCLES = 4
GAP_S = 30.0  # between two kills
OUTAGE_S = 3.0  # from a kill to its rejoin
STEP_SPAN_S = 10.0  # an island's step time before a kill is timed over this long at least
WAIT_S = 120.0
METRICS = ("kill_to_lost_s", "rejoin_to_first_step_s", "rejoin_to_first_merge_s",
           "create_to_training_s")


def workload(corpus: Path) -> dict[str, Any]:
    """The issue's workload: 4 layers, 128 wide, batch 8, H = 20, one island per region."""
    return {
        "model": {"n_layer": 4, "n_embd": 128, "n_head": 4, "block_size": 64},
        "data": {"path": str(corpus)},
        "sync": {"inner_steps": 20, "fragments": 2, "overlap_steps": 1, "min_quorum": 2},
        "optim": {"inner_lr": 2e-3, "warmup_steps": 20},
        "eval": {"tokens": 4096, "interval_steps": 10_000},
        "checkpoint": {"interval_s": 600.0},
        "budget": {"total_tokens": 10**12},
        "islands": [{"name": region, "region": region, "batch_size": 8, "speed": 0.5}
                    for region in REGIONS],
    }


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(values: list[float]) -> dict[str, Any]:
    p50, p95 = percentile(values, 50), percentile(values, 95)
    return {"p50": None if p50 is None else round(p50, 3),
            "p95": None if p95 is None else round(p95, 3), "n": len(values)}


def wait(check: Any, what: str, timeout: float = WAIT_S, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(every)


def pools_ready(system: BenchSystem) -> bool:
    from syncd.connection import connect
    from syncd.pool_store import PoolStore

    pools = PoolStore(connect(system.redis_url))
    return all(pools.ready(region) >= 1 for region in REGIONS)


def create_and_train(label: str, config: dict[str, Any]) -> tuple[Any, Any, float]:
    """Create and start a run; seconds from the create to every island's first
    training heartbeat."""
    from syncd.connection import connect
    from syncd.store import RunStore
    from webapp.runs.lifecycle import create_run, start_run

    asked = time.time()
    run = create_run(name=label, mode="decoupled", config=config, user=None)
    start_run(run, by=None)
    store = RunStore(connect(text("REDIS_URL")), run.pk)
    first: dict[str, float] = {}

    def all_training() -> bool:
        for name, beat in store.signals.heartbeats().items():
            if beat.state == "training" and beat.epoch == 1:
                first.setdefault(name, beat.time)
        return len(first) == len(config["islands"])

    wait(all_training, f"{label}: every island training")
    seconds = max(first.values()) - asked
    results.say(f"  {label}: run {run.pk}, create to all training {seconds:.2f} s")
    return run, store, seconds


def round_fill_s(run: Any, since: float, until: float) -> float | None:
    """The fault-free median time to fill a round: the gaps between successive merges
    of each fragment between `since` and `until`."""
    merges = run.events.filter(kind="merge").order_by("time")
    times: dict[int, list[float]] = {}
    for e in merges:
        at = e.time.timestamp()
        if since <= at <= until:
            times.setdefault(e.detail.get("fragment", 0), []).append(at)
    gaps = [b - a for t in times.values() for a, b in itertools.pairwise(t)]
    return statistics.median(gaps) if gaps else None


def cycle(run: Any, store: Any, island: str, kind: str, operator: Any) -> dict[str, Any]:
    """One kill and rejoin of `island`; its figures from the run's records."""
    from webapp.runs.membership import rejoin_island

    beat = store.signals.heartbeats()[island]
    epoch, pid = beat.epoch, beat.pid
    if kind == "operator":
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
    else:
        store.signals.send_command(island, "kill", epoch=epoch, report=True)
        death = wait(lambda: (store.signals.deaths().get(island) or {}).get("epoch") == epoch
                     and store.signals.deaths()[island], f"{island}'s death report")
        killed = float(death["time"])
    lost = wait(lambda: run.events.filter(kind="island_lost", island__name=island,
                                          time__gte=_when(killed - 1)).order_by("id").last(),
                f"{island} lost")
    time.sleep(max(killed + OUTAGE_S - time.time(), 0.0))  # the outage itself
    asked = time.time()
    rejoin_island(run, island, by=operator if kind == "operator" else None)
    rejoined = wait(lambda: run.events.filter(
        kind="rejoin", island__name=island, actor=None, detail__epoch=epoch + 1,
        detail__has_key="seconds_to_first_step").first(), f"{island} training again")
    seconds_to_first_step = float(rejoined.detail["seconds_to_first_step"])
    first_step = asked + seconds_to_first_step
    merge = wait(lambda: first_merge_of(island, epoch + 1, run.events.filter(
        kind="merge", time__gte=_when(first_step)).order_by("id")),
        f"a merge of {island}'s update")
    sample = {"island": island, "kind": kind, "epoch": epoch + 1,
              "warm": bool(rejoined.detail.get("warm")),
              "lost_cause": lost.detail.get("cause"),
              **cycle_seconds(killed, lost.time.timestamp(), asked, seconds_to_first_step,
                              merge.time.timestamp()),
              "phases": rejoined.detail.get("phases") or {}}
    results.say(f"  {kind} cycle {island}: lost {sample['kill_to_lost_s']:.3f} s, first step "
                f"{sample['rejoin_to_first_step_s']:.3f} s, first merge "
                f"{sample['rejoin_to_first_merge_s']:.3f} s, warm {sample['warm']}, "
                f"{sample['phases']}")
    return sample


def first_merge_of(island: str, epoch: int, merges: Iterable[Any]) -> Any:
    """The first of `merges` (events in order, from the rejoined island's first step
    on) that took in an update of `island`'s epoch `epoch` or later (the merge event's
    `epochs`, syncd/publisher.py): an older epoch's update still pending is not the
    rejoined island's; None before one has."""
    return next((e for e in merges if island in (e.detail.get("weights") or {})
                 and (e.detail.get("epochs") or {}).get(island, -1) >= epoch), None)


def first_merge_bound_s(step_times: Iterable[float | None], inner_steps: int,
                        min_quorum: int) -> float | None:
    """The bound on rejoin to first merge: 1 s (the rejoin to the first step) plus a
    fragment's cadence (diloco.uptime.fragment_cadence: the configured H steps at
    the K-th fastest island's fault-free step time), whatever the merges of the run
    took; None without a step time."""
    cadence = fragment_cadence(step_times, inner_steps, min_quorum)
    return None if cadence is None else round(1.0 + cadence, 3)


def cycle_seconds(killed: float, lost_at: float, asked: float, seconds_to_first_step: float,
                  merged_at: float) -> dict[str, float]:
    """A kill and rejoin's figures from its timestamps (seconds on one clock): from the
    kill to syncd marking the island lost, and from the rejoin asked for to the new
    epoch's first step (its own report, after `asked`) and to the first merge of its
    update."""
    return {"kill_to_lost_s": round(lost_at - killed, 3),
            "rejoin_to_first_step_s": round(seconds_to_first_step, 3),
            "rejoin_to_first_merge_s": round(merged_at - asked, 3)}


def _when(seconds: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC)


def run_mode(system: BenchSystem, mode: str, profile: dict[str, Any], corpus: Path,
             operator: Any) -> dict[str, Any]:
    from webapp.runs.lifecycle import stop_run

    config = workload(corpus)
    creates, run, store = [], None, None
    for n in range(profile["creates"]):
        if run is not None:
            stop_run(run, by=None)
            _wait_stopped(store)
        if mode == "warm":
            wait(lambda: pools_ready(system), "every region's pool ready", 300, 0.2)
        run, store, seconds = create_and_train(f"{mode} run {n + 1}", config)
        creates.append(seconds)
    trained_at = time.time()
    time.sleep(GAP_S)  # a fault-free stretch: the time to fill a round
    fill = round_fill_s(run, trained_at, time.time())
    samples = []
    next_kill = time.time()
    for i in range(profile["cycles"]):
        time.sleep(max(next_kill - time.time(), 0.0))
        next_kill = time.time() + GAP_S
        island = REGIONS[i % len(REGIONS)]
        samples.append(cycle(run, store, island, "operator" if i % 2 == 0 else "chaos",
                             operator))
    stop_run(run, by=None)
    _wait_stopped(store)
    # The islands' fault-free step times, as syncd's accounting measured them (samples
    # that span a fault or a loss left out): the run's outcome.
    outcome = wait(lambda: (store.status() or {}).get("outcome"), f"the {mode} run's outcome")
    sync = config["sync"]
    bound = first_merge_bound_s(outcome["step_time_s"].values(), sync["inner_steps"],
                                sync["min_quorum"])
    return {"creates": creates, "round_fill_s": fill, "first_merge_bound_s": bound,
            "samples": samples}


def _wait_stopped(store: Any) -> None:
    wait_islands_stopped(store, list(REGIONS))


def summarize(modes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per mode the p50 and p95 of each figure; a warm cycle that found the pool empty
    counts as cold."""
    samples = {"warm": [s for s in modes["warm"]["samples"] if s["warm"]],
               "cold": modes["cold"]["samples"] + [s for s in modes["warm"]["samples"]
                                                   if not s["warm"]]}
    out = {}
    for mode in ("warm", "cold"):
        rows = samples[mode]
        out[mode] = {key: spread([s[key] for s in rows]) for key in METRICS[:3]}
        out[mode]["create_to_training_s"] = spread(modes[mode]["creates"])
        phases = {p for s in rows for p in s["phases"]}
        out[mode]["phases_p50_s"] = {p: round(statistics.median(
            s["phases"][p] for s in rows if p in s["phases"]), 3) for p in sorted(phases)}
        out[mode]["round_fill_s"] = modes[mode]["round_fill_s"]
        out[mode]["first_merge_bound_s"] = modes[mode].get("first_merge_bound_s")
        out[mode]["cycles"] = len(rows)
    return out


def start(system: BenchSystem, concurrency: int) -> Any:
    """Start syncd, a worker of `concurrency` per region and a pool of one warm standby
    per region; returns the operator who rejoins islands."""
    system.setup_django()
    from django.contrib.auth import get_user_model

    operator = get_user_model().objects.create_user("bench-operator")
    system.start_syncd()
    system.start_workers(concurrency=concurrency)
    system.start_pools(size=1)
    return operator


def real_size_workload(preset: str, corpus: Path) -> dict[str, Any]:
    """The preset's run at its size, its islands in this bench's regions, batch 1."""
    from diloco.presets import PRESETS

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    config = dict(PRESETS[preset][1])
    islands = [{**island, "region": REGIONS[i % len(REGIONS)], "batch_size": 1}
               for i, island in enumerate(config["islands"])]
    return {**config, "data": {"path": str(corpus)}, "islands": islands,
            "eval": {"tokens": 4096, "interval_steps": 10**6},
            "checkpoint": {"interval_s": 3600.0}, "budget": {"total_tokens": 10**12}}


def pull_wire_s(config: dict[str, Any], fragment_bytes: Iterable[int]) -> float:
    """The emulated link's seconds for a rejoin's pull: each fragment's full message
    over the first island's link, one after the other."""
    from diloco.wan import transfer_time

    island = config["islands"][0]
    return sum(transfer_time(n, island.get("bandwidth_gbps", 2.0),
                             island.get("latency_ms", 30.0)) for n in fragment_bytes)


def real_size(preset: str) -> int:
    """A warm rejoin at the preset's size: rejoin to first step against the pull's
    emulated wire time plus 1 s."""
    from syncd.connection import connect
    from syncd.store import RunStore

    started = time.time()
    system = BenchSystem(HOME, list(REGIONS))
    samples: list[dict[str, Any]] = []
    try:
        operator = start(system, concurrency=1)
        from webapp.runs.lifecycle import stop_run

        config = real_size_workload(preset, make_corpus(HOME / "corpus.txt"))
        wait(lambda: pools_ready(system), "every region's pool ready", 600, 0.2)
        run, store, create_s = create_and_train(f"{preset} run", config)
        full = RunStore(connect(text("REDIS_URL")), run.pk)
        fragment_bytes = [len(full.globals.full(p) or b"") for p in sorted(full.globals.versions())]
        wire_s = pull_wire_s(config, fragment_bytes)
        results.say(f"  pull of {sum(fragment_bytes) / 1e6:.0f} MB: {wire_s:.2f} s of "
                    "emulated wire")
        islands = [island["name"] for island in config["islands"]]
        for i in range(REAL_SIZE_CYCLES):
            wait(lambda: pools_ready(system), "every region's pool ready", 600, 0.2)
            time.sleep(GAP_S)
            samples.append(real_size_cycle(run, store, islands[i % len(islands)], operator))
        stop_run(run, by=None)
        wait_islands_stopped(store, islands)
    finally:
        system.stop()
    warm = [s for s in samples if s["warm"]]
    first_step = [s["rejoin_to_first_step_s"] for s in warm]
    cost = [s["rejoin_cost_s"] for s in warm]
    bound = round(wire_s + 1.0, 3)
    out: dict[str, Any] = {
        "preset": preset, "params": sum(fragment_bytes) // 4, "create_to_training_s": create_s,
        "pull_bytes": sum(fragment_bytes), "pull_wire_s": round(wire_s, 3),
        "rejoin_to_first_step_s": spread(first_step), "rejoin_cost_s": spread(cost),
        "cycles": len(samples),
        "warm_cycles": len(warm), "samples": samples,
        "phases_p50_s": {p: round(statistics.median(s["phases"][p] for s in warm
                                                    if p in s["phases"]), 3)
                         for p in sorted({p for s in warm for p in s["phases"]})},
        "workload": real_size_workload(preset, Path("corpus"))}
    out["checks"] = {
        "warm rejoin's cost p95 (s), the pull's wire time + 1 s": results.check(
            out["rejoin_cost_s"]["p95"] if warm else float("inf"), bound, at_least=False)}
    out["seconds"] = round(time.time() - started, 1)
    path = results.write(f"rejoin-{preset}", out)
    print(f"warm rejoin to first step {out['rejoin_to_first_step_s']}, its cost (less a "
          f"step) {out['rejoin_cost_s']}, phases (p50 s) {out['phases_p50_s']}, bound "
          f"{bound} s")
    print(results.checks_table(out["checks"]))
    print(f"\n{out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])


def step_time_before(signals: Any, island: str, span_s: float = STEP_SPAN_S) -> float:
    """`island`'s seconds per inner step now: from the first heartbeat that shows a new
    step to the first that shows a later one at least `span_s` after, over the steps
    between (each end a heartbeat's lag after its step, alike: an average of whole
    steps, whatever the heartbeats' pace against the step's)."""
    def new_step(after: int) -> Heartbeat:
        return wait(lambda: (beat := signals.heartbeats()[island]).step > after and beat,
                    f"{island}'s step after {after}")

    start = new_step(signals.heartbeats()[island].step)
    end = start
    while end.time < start.time + span_s:
        end = new_step(end.step)
    return (end.time - start.time) / (end.step - start.step)


def real_size_cycle(run: Any, store: Any, island: str, operator: Any) -> dict[str, Any]:
    """One SIGKILL and an operator's rejoin of `island`, timed to its first step."""
    from webapp.runs.membership import rejoin_island

    beat = store.signals.heartbeats()[island]
    epoch, pid = beat.epoch, beat.pid
    step_s = step_time_before(store.signals, island)
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    wait(lambda: run.events.filter(kind="island_lost", island__name=island,
                                   time__gte=_when(killed - 1)).exists(), f"{island} lost")
    time.sleep(max(killed + OUTAGE_S - time.time(), 0.0))
    rejoin_island(run, island, by=operator)
    rejoined = wait(lambda: run.events.filter(
        kind="rejoin", island__name=island, detail__epoch=epoch + 1,
        detail__has_key="seconds_to_first_step").first(), f"{island} training again", 600)
    first_step = float(rejoined.detail["seconds_to_first_step"])
    sample = {"island": island, "epoch": epoch + 1, "warm": bool(rejoined.detail.get("warm")),
              "rejoin_to_first_step_s": first_step, "step_time_s": round(step_s, 4),
              "rejoin_cost_s": round(first_step - float(step_s), 3),
              "phases": rejoined.detail.get("phases") or {},
              # the first step's CPU seconds on the island's training thread, beside its
              # wall time (phases' first_step): the rest was waiting for a core
              "first_step_cpu_s": rejoined.detail.get("first_step_cpu_s")}
    results.say(f"  cycle {island}: first step {first_step:.3f} s, a step {step_s:.3f} s, "
                f"warm {sample['warm']}, {sample['phases']}, its CPU "
                f"{sample['first_step_cpu_s']} s")
    return sample


def main(quick: bool = False, preset: str | None = None) -> int:
    if preset is not None:
        return real_size(preset)
    profile = PROFILES["quick" if quick else "full"]
    started = time.time()
    system = BenchSystem(HOME, list(REGIONS))
    modes: dict[str, dict[str, Any]] = {}
    try:
        operator = start(system, concurrency=2)
        corpus = make_corpus(HOME / "corpus.txt")
        modes["warm"] = run_mode(system, "warm", profile, corpus, operator)
        for region in REGIONS:
            system.stop_process(f"pool-{region}")  # the pool off: cold starts only
        modes["cold"] = run_mode(system, "cold", profile, corpus, operator)
    finally:
        system.stop()
    return report(profile, quick, modes, time.time() - started)


def report(profile: dict[str, Any], quick: bool, modes: dict[str, dict[str, Any]],
           seconds: float) -> int:
    out: dict[str, Any] = {"profile": "quick" if quick else "full", **profile,
                           "gap_s": GAP_S, "outage_s": OUTAGE_S,
                           "workload": workload(Path("corpus")), **summarize(modes),
                           "raw": modes}
    warm = out["warm"]
    bound = modes["warm"].get("first_merge_bound_s")
    checks = {}
    if warm["cycles"]:
        checks["warm rejoin to first step p95 (s)"] = results.check(
            warm["rejoin_to_first_step_s"]["p95"], 1.0, at_least=False)
        checks["warm SIGKILL to lost p95 (s)"] = results.check(
            warm["kill_to_lost_s"]["p95"], 0.5, at_least=False)
        # A bound of 0 when no step time was known: the check fails rather than passes.
        checks["warm rejoin to first merge p95 (s), 1 s + a fragment's cadence"] = \
            results.check(warm["rejoin_to_first_merge_s"]["p95"], bound or 0.0,
                          at_least=False)
    else:
        checks["warm cycles that found a standby"] = results.check(0, 1)
    checks["warm create to all training p95 (s)"] = results.check(
        warm["create_to_training_s"]["p95"], 3.0, at_least=False)
    out["checks"] = checks
    out["seconds"] = round(seconds, 1)
    path = results.write("rejoin-quick" if quick else "rejoin", out)
    rows = [{"mode": mode, **{k: out[mode][k]["p50"] for k in METRICS},
             **{f"{k}_p95": out[mode][k]["p95"] for k in METRICS}, "cycles": out[mode]["cycles"]}
            for mode in ("warm", "cold")]
    print(results.table([{"mode": r["mode"], **{k: f"{r[k]} / {r[k + '_p95']}"
                                                for k in METRICS}, "cycles": r["cycles"]}
                         for r in rows], ["mode", *METRICS, "cycles"]))
    print("(p50 / p95, seconds)")
    for mode in ("warm", "cold"):
        print(f"{mode} phases (p50 s): {out[mode]['phases_p50_s']}; round fill "
              f"{out[mode]['round_fill_s']}, first merge bound "
              f"{out[mode]['first_merge_bound_s']}")
    print()
    print(results.checks_table(checks))
    print(f"\n{out['seconds']} s; wrote {path}")
    return results.exit_code(checks)
