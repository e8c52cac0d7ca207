"""The runtime's own cost: `python -m bench efficiency [--quick]`.

It starts the README's start command, `python -m webapp.start`, with state of its
own under var/bench-efficiency (Redis, SQLite, syncd, a Celery worker and a pool
manager per region of the default four, the control worker, the web app), stops
its demo run, and for each workload (4 islands, one per region, trained through
runs created with the run services) measures side by side, in phases that take
turns so that drift of the machine falls on both: bare, system, bare[, system,
bare]:

- system: a run of the workload, started warm; once every island has trained its
  warm-up outer steps, a window that lasts until every island has trained
  `outer_steps` more outer steps (H inner steps each). The merged tokens per
  second are the least-squares slope of tokens merged (syncd's merge events:
  each merge's tokens, over the run's fragments) against the events' times in
  the window; each island's step time is the inverse of the slope of its
  heartbeats' step against their time; its pulls the growth of the time its
  training thread spent on them (the heartbeats' pull_wait_s, or pull_s where
  pulls ran on that thread). The CPU of every process of the start (user + system time, from psutil,
  sampled every second) is split by kind: islands (the processes the
  heartbeats name), standbys (the pool managers' other children), syncd,
  pool_managers, redis, celery (the workers and their prefork children), web
  and start (the start command itself and its guard, webapp/guard.py), as
  fractions of the whole machine.
- bare: as many processes as islands, each bench.overhead.BareLoop (the same
  model, initial weights, batch sampling, forward, backward, clipping at 1.0 and
  AdamW step, torch on one thread and glibc's thresholds as an island's,
  syncd.malloc.return_large_frees), no sends, all at once for
  `bare_s` seconds; trained tokens per second summed over them.
- idle, after the workload's phases: the run stopped and the pools refilled, the
  whole system's CPU share with no run for `idle_s` seconds.

`ratio` is merged tokens/s over the bare loops' trained tokens/s;
`island_step_ratio` is the bare step time over the island's (1 is bare speed);
`pulls_of_gap` is the part of the island's extra time per step that is pulls.
The same per CPU-second, which another load on the machine moves far less than
per second: `ratio_per_cpu` (merged tokens per CPU-second of the whole system
over trained tokens per CPU-second of the bare loops) and `island_cpu_step_ratio`
(a bare step's CPU over an island's).
It writes bench/results/efficiency.json (efficiency-quick.json with --quick),
prints a table and the checks against the targets, and exits non-zero when one
is missed.

`python -m bench.efficiency SPEC` is one bare loop (what the benchmark starts, and
bench/utilization.py's island utilization): SPEC is JSON with the model, the corpus
and optionally the batch size (default BATCH_SIZE); it says "ready" once warm, reads
the seconds to train from stdin, and prints its steps and seconds as JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench import results
from bench.goodput import make_corpus, wait_islands_stopped
from bench.procs import CLK_TCK, processes
from bench.system import ROOT, StartedSystem
from diloco.config import RunConfig
from diloco.data import load_corpus
from syncd.environment import data_dir

HOME = ROOT / "var" / "bench-efficiency"
REGIONS = ("us-east", "us-central", "us-west", "us-south")  # the start command's default
WORKLOADS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 4, "n_embd": 128, "n_head": 4, "block_size": 128},
    "small": {"n_layer": 6, "n_embd": 256, "n_head": 8, "block_size": 128},
}
BATCH_SIZE, INNER_STEPS, FRAGMENTS, MIN_QUORUM = 8, 20, 1, 2
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"rounds": 2, "warmup_outer_steps": 2, "outer_steps": {"tiny": 10, "small": 10},
             "bare_s": {"tiny": 60.0, "small": 90.0}, "idle_s": 30.0},
    "quick": {"rounds": 1, "warmup_outer_steps": 1, "outer_steps": {"tiny": 5, "small": 2},
              "bare_s": {"tiny": 15.0, "small": 20.0}, "idle_s": 10.0},
}
TARGETS = {"ratio": {"tiny": 0.85, "small": 0.90}, "island_step_ratio": 0.95,
           "non_island_share": 0.05, "idle_cpu_share": 0.01}
KINDS = ("islands", "standbys", "syncd", "pool_managers", "redis", "celery", "web", "start")
SAMPLE_S = 1.0
PHASE_TIMEOUT_S = 1800.0
COLUMNS = ("name", "ratio", "island_step_ratio", "merged_tokens_per_s", "bare_tokens_per_s",
           "island_step_ms", "bare_step_ms", "pull_ms_per_step", "pulls_of_gap",
           "non_island_share", "idle_cpu_share", "machine_busy_training")


def run_config(model: dict[str, int], corpus: str, batch_size: int = BATCH_SIZE
               ) -> dict[str, Any]:
    """A workload's run: 4 islands, one per region, H = 20, one fragment, K = 2."""
    return {"model": model, "data": {"path": corpus},
            "sync": {"inner_steps": INNER_STEPS, "fragments": FRAGMENTS,
                     "min_quorum": MIN_QUORUM},
            "budget": {"total_tokens": 10**12},
            "islands": [{"name": region, "region": region, "batch_size": batch_size}
                        for region in REGIONS]}


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of y against x."""
    if len(points) < 2:
        raise ValueError(f"a slope needs two points or more, got {len(points)}")
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        raise ValueError("a slope needs two different x")
    return sum((x - mx) * (y - my) for x, y in points) / sxx


# -- CPU, from psutil ----------------------------------------------------------

def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, utime + stime in ticks, command line) of every running process.
    One that has exited and awaits its parent (a zombie) is left out: its command line
    reads empty, so nothing tells its kind, and its CPU up to the last sample that saw
    it running is counted already."""
    return {proc.pid: (proc.ppid, proc.cpu_ticks, proc.cmdline) for proc in processes()
            if proc.running}


def service_kind(cmdline: str) -> str:
    """The kind of a process the start command started itself."""
    for needle, kind in (("redis-server", "redis"), ("manage.py syncd", "syncd"),
                         ("pool_manager", "pool_managers"), ("celery", "celery"),
                         ("daphne", "web"), ("webapp.guard", "start")):
        if needle in cmdline:
            return kind
    raise ValueError(f"the start started a process of no known kind: {cmdline!r}")


def kinds_of(root: int, table: dict[int, tuple[int, int, str]], islands: set[int]
             ) -> dict[int, str]:
    """The kind of `root` (the start) and of every process below it: an island if its
    run's heartbeats name it or it runs trainer.runner, else the kind of the service
    it descends from, a pool manager's children being standbys."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    kinds = {root: "start"}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid in children.get(parent, []):
            if parent == root:
                kind = service_kind(table[pid][2])
            else:
                kind = "standbys" if kinds[parent] == "pool_managers" else kinds[parent]
            kinds[pid] = kind
            todo.append(pid)
    for pid in kinds:
        if pid in islands or "trainer.runner" in table[pid][2]:
            kinds[pid] = "islands"
    return kinds


def machine_ticks() -> tuple[int, int]:
    """(busy, all) ticks of the whole machine since boot: user, nice, system, idle,
    iowait, irq, softirq and steal, less idle and iowait for busy."""
    times = psutil.cpu_times()
    values = [round(getattr(times, name) * CLK_TCK) for name in
              ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class CpuMeter:
    """The CPU every process of the start used between the first and the last sample,
    by kind; a process first seen after the first sample counts from its start."""

    def __init__(self, root: int):
        self.root = root
        self.first: dict[int, int] = {}
        self.last: dict[int, tuple[str, int]] = {}
        self.started = self.machine_first = None
        self.ended = 0.0
        self.machine_last = (0, 0)

    def sample(self, islands: set[int]) -> None:
        table = process_table()
        now, machine = time.monotonic(), machine_ticks()
        first = self.started is None
        if first:
            self.started, self.machine_first = now, machine
        for pid, kind in kinds_of(self.root, table, islands).items():
            ticks = table[pid][1]
            self.first.setdefault(pid, ticks if first else 0)
            self.last[pid] = (kind, ticks)
        self.ended, self.machine_last = now, machine

    def result(self) -> dict[str, Any]:
        """Ticks by kind, the machine's capacity in ticks over the span, and the whole
        machine's busy ticks (this system's and everything else's)."""
        if self.started is None or self.machine_first is None:
            raise ValueError("a CPU meter needs samples")
        ticks = dict.fromkeys(KINDS, 0)
        for pid, (kind, last) in self.last.items():
            ticks[kind] += last - self.first[pid]
        seconds = self.ended - self.started
        return {"seconds": round(seconds, 3), "ticks": ticks,
                "capacity_ticks": seconds * CLK_TCK * (os.cpu_count() or 1),
                "machine_busy_ticks": self.machine_last[0] - self.machine_first[0],
                "machine_all_ticks": self.machine_last[1] - self.machine_first[1]}


def shares(meters: list[dict[str, Any]]) -> dict[str, float]:
    """Each kind's share of the whole machine over the meters' spans together."""
    capacity = sum(m["capacity_ticks"] for m in meters)
    return {kind: round(sum(m["ticks"][kind] for m in meters) / capacity, 4) for kind in KINDS}


def machine_busy(meters: list[dict[str, Any]]) -> float:
    return round(sum(m["machine_busy_ticks"] for m in meters)
                 / max(sum(m["machine_all_ticks"] for m in meters), 1), 4)


# -- the phases ----------------------------------------------------------------

def wait(check: Callable[[], Any], what: str, system: StartedSystem,
         timeout: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        system.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.2)
    return value


def wait_pools_ready(system: StartedSystem) -> None:
    """Every region's standby is ready: runs start warm, and nothing is importing."""
    from syncd.connection import connect
    from syncd.pool_store import PoolStore

    pools = PoolStore(connect(system.redis_url))
    wait(lambda: all(pools.ready(region) >= 1 for region in REGIONS),
         "every region's pool ready", system, 600.0)


def stop_demo(system: StartedSystem) -> None:
    """The start's demo run stopped, its islands gone, the pools full again."""
    from syncd.connection import connect
    from syncd.store import RunStore
    from webapp.processes import wait_for
    from webapp.runs.lifecycle import stop_run
    from webapp.runs.models import Run

    # The start makes the demo once its pools announce themselves (up to a minute).
    wait_for(lambda: Run.objects.filter(name="demo", state=Run.State.RUNNING).exists(), 120,
             "the start's demo run", 0.5)
    demo = Run.objects.get(name="demo")
    stop_run(demo, by=None)
    wait_islands_stopped(RunStore(connect(system.redis_url), demo.pk),
                         [island.name for island in demo.islands.all()], timeout=120.0)
    wait_pools_ready(system)


def system_phase(system: StartedSystem, config: dict[str, Any], warm: int, window: int,
                 label: str, before_stop: Callable[[Any, Any], dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    """One run of `config` (its islands, sync.fragments): once every island has trained
    `warm` steps, a window of `window` more steps each; its merged tokens/s, island step
    times, pulls and CPU, with what `before_stop` (of the run and its RunStore) reads
    before the run is stopped."""
    from datetime import UTC, datetime

    from syncd.connection import connect
    from syncd.store import RunStore
    from webapp.runs.lifecycle import create_run, start_run, stop_run
    from webapp.runs.models import Event

    names = [island["name"] for island in config["islands"]]
    fragments = config["sync"]["fragments"]
    run = create_run(name=label, mode="decoupled", config=config, user=None)
    start_run(run, by=None)
    store = RunStore(connect(system.redis_url), run.pk)

    def warmed() -> bool:
        beats = store.signals.heartbeats()
        return len(beats) == len(names) and all(
            b.state == "training" and b.step >= warm for b in beats.values())

    wait(warmed, f"{label}: every island past its warm-up", system, PHASE_TIMEOUT_S)
    meter = CpuMeter(system.pid)
    beats: dict[str, dict[float, tuple[int, float]]] = {n: {} for n in names}
    started, first = time.time(), store.signals.heartbeats()
    while True:
        system.check()
        now = store.signals.heartbeats()
        meter.sample({b.pid for b in now.values()})
        for island, b in now.items():
            if b.time >= started:  # the training thread's time on pulls
                beats[island][b.time] = (b.step, b.pull_wait_s)
        if stopped := [n for n, b in now.items() if b.state == "stopped"]:
            raise RuntimeError(f"{label}: {', '.join(stopped)} stopped in the window; see "
                               f"{system.home / 'logs'}")
        if all(now[n].step - first[n].step >= window for n in names):
            break
        if time.time() - started > PHASE_TIMEOUT_S:
            raise TimeoutError(f"{label}: the window did not end in {PHASE_TIMEOUT_S:g} s")
        time.sleep(SAMPLE_S)
    ended = time.time()
    merges = Event.objects.filter(run=run, kind="merge",
                                  time__gte=datetime.fromtimestamp(started, UTC),
                                  time__lte=datetime.fromtimestamp(ended, UTC)).order_by("time")
    merged, points = 0, []
    for event in merges:
        merged += event.detail["tokens"]
        points.append((event.time.timestamp(), merged / fragments))
    islands = {}
    for island, seen in beats.items():
        samples = sorted(seen.items())
        (s0, p0), (s1, p1) = samples[0][1], samples[-1][1]
        islands[island] = {"step_s": 1 / slope([(t, s) for t, (s, _) in samples]),
                           "steps": s1 - s0, "pull_s_per_step": (p1 - p0) / max(s1 - s0, 1)}
    read = before_stop(run, store) if before_stop else {}
    stop_run(run, by=None)
    wait_islands_stopped(store, names, timeout=120.0)
    out = {"run": run.pk, "seconds": round(ended - started, 2), "merges": len(points),
           "merged_tokens_per_s": slope(points), "islands": islands, "cpu": meter.result(),
           "island_steps": sum(island["steps"] for island in islands.values()), **read}
    results.say(f"  {label}: {out['merged_tokens_per_s']:,.0f} merged tokens/s over "
                f"{len(points)} merges in {out['seconds']:.0f} s, island steps "
                f"{', '.join(str(round(1000 * i['step_s'])) for i in islands.values())} ms, "
                f"machine busy {machine_busy([out['cpu']]):.2f}")
    return out


def bare_phase(model: dict[str, Any], corpus: Path, seconds: float, label: str,
               loops: int = len(REGIONS), batch_size: int = BATCH_SIZE) -> dict[str, Any]:
    """`loops` bare loops of `model` (one per island), at once, for `seconds` once every
    one is warm.

    Each leads a session of its own, as every island process does: with the kernel's
    autogroup scheduling each session gets its share of a busy machine, and four loops
    in the benchmark's one session got far less CPU than the islands under load,
    which made the bare figure slower than the islands it bounds."""
    spec = json.dumps({"model": model, "corpus": str(corpus), "batch_size": batch_size})
    started = [subprocess.Popen([sys.executable, "-m", "bench.efficiency", spec], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
               for _ in range(loops)]
    try:
        for loop in started:
            if (line := loop.stdout.readline().strip()) != "ready":
                raise RuntimeError(f"a bare loop said {line!r}, not ready")
        for loop in started:
            loop.stdin.write(f"{seconds}\n")
            loop.stdin.flush()
        done = [json.loads(loop.stdout.readline()) for loop in started]
    finally:
        for loop in started:
            loop.kill()
            loop.wait()
    tokens_per_step = batch_size * model["block_size"]
    out = {"tokens_per_s": sum(d["steps"] * tokens_per_step / d["seconds"] for d in done),
           "step_s": statistics.fmean(d["seconds"] / d["steps"] for d in done),
           "tokens": sum(d["steps"] for d in done) * tokens_per_step,
           "cpu_s": sum(d["cpu_s"] for d in done),
           "steps": [d["steps"] for d in done], "seconds": seconds}
    results.say(f"  {label}: {out['tokens_per_s']:,.0f} trained tokens/s, "
                f"{1000 * out['step_s']:.0f} ms/step")
    return out


def idle_phase(system: StartedSystem, seconds: float) -> dict[str, Any]:
    """The whole system's CPU with no run, the pools full."""
    wait_pools_ready(system)
    meter = CpuMeter(system.pid)
    deadline = time.monotonic() + seconds
    while True:
        meter.sample(set())
        if time.monotonic() >= deadline:
            return meter.result()
        time.sleep(SAMPLE_S)


def measure(system: StartedSystem, name: str, corpus: Path, profile: dict[str, Any]
            ) -> dict[str, Any]:
    """A workload's phases in turn: bare, then system and bare `rounds` times, then idle."""
    bare = [bare_phase(WORKLOADS[name], corpus, profile["bare_s"][name], f"{name} bare 1")]
    runs = []
    for r in range(profile["rounds"]):
        wait_pools_ready(system)
        runs.append(system_phase(system, run_config(WORKLOADS[name], str(corpus)),
                                 profile["warmup_outer_steps"] * INNER_STEPS,
                                 profile["outer_steps"][name] * INNER_STEPS,
                                 f"{name} system {r + 1}"))
        wait_pools_ready(system)
        bare.append(bare_phase(WORKLOADS[name], corpus, profile["bare_s"][name],
                               f"{name} bare {r + 2}"))
    idle = idle_phase(system, profile["idle_s"])
    return summarize(name, runs, bare, idle)


def summarize(name: str, runs: list[dict[str, Any]], bare: list[dict[str, Any]],
              idle: dict[str, Any], model: dict[str, Any] | None = None) -> dict[str, Any]:
    """A workload's figures from its phases; its `model` WORKLOADS[name] unless given."""
    merged = statistics.fmean(r["merged_tokens_per_s"] for r in runs)
    trained = statistics.fmean(b["tokens_per_s"] for b in bare)
    island_step = statistics.fmean(i["step_s"] for r in runs for i in r["islands"].values())
    bare_step = statistics.fmean(b["step_s"] for b in bare)
    pull = statistics.fmean(i["pull_s_per_step"] for r in runs for i in r["islands"].values())
    cpu = shares([r["cpu"] for r in runs])
    gap = island_step - bare_step
    # Per CPU-second, which another load on the machine moves far less than per second.
    system_cpu_s = sum(sum(r["cpu"]["ticks"].values()) for r in runs) / CLK_TCK
    merged_per_cpu = sum(r["merged_tokens_per_s"] * r["cpu"]["seconds"] for r in runs) \
        / system_cpu_s
    trained_per_cpu = sum(b["tokens"] for b in bare) / sum(b["cpu_s"] for b in bare)
    island_cpu_step = sum(r["cpu"]["ticks"]["islands"] for r in runs) / CLK_TCK \
        / sum(r["island_steps"] for r in runs)
    bare_cpu_step = sum(b["cpu_s"] for b in bare) / sum(sum(b["steps"]) for b in bare)
    return {"name": name, "islands": len(runs[0]["islands"]), "model": model or WORKLOADS[name],
            "ratio": round(merged / trained, 4),
            "island_step_ratio": round(bare_step / island_step, 4),
            "cpu_share": cpu,
            "non_island_share": round(sum(v for k, v in cpu.items() if k != "islands"), 4),
            "idle_cpu_share": round(sum(shares([idle]).values()), 4),
            "idle_cpu_by_kind": shares([idle]),
            "ratio_per_cpu": round(merged_per_cpu / trained_per_cpu, 4),
            "island_cpu_step_ratio": round(bare_cpu_step / island_cpu_step, 4),
            "island_cpu_ms_per_step": round(1000 * island_cpu_step, 2),
            "bare_cpu_ms_per_step": round(1000 * bare_cpu_step, 2),
            "merged_tokens_per_s": round(merged, 1), "bare_tokens_per_s": round(trained, 1),
            "island_step_ms": round(1000 * island_step, 2),
            "bare_step_ms": round(1000 * bare_step, 2),
            "pull_ms_per_step": round(1000 * pull, 3),
            "pulls_of_gap": round(pull / gap, 4) if gap > 0 else None,
            "machine_busy_training": machine_busy([r["cpu"] for r in runs]),
            "machine_busy_idle": machine_busy([idle]),
            "phases": {"system": runs, "bare": bare, "idle": idle}}


def checks_of(workloads: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    checks = {}
    for w in workloads:
        n = w["name"]
        checks[f"{n}: merged / bare tokens/s"] = results.check(w["ratio"], TARGETS["ratio"][n])
        checks[f"{n}: island / bare step rate"] = results.check(
            w["island_step_ratio"], TARGETS["island_step_ratio"])
        checks[f"{n}: non-island kinds' share while training"] = results.check(
            w["non_island_share"], TARGETS["non_island_share"], at_least=False)
        checks[f"{n}: the whole system's share with no run"] = results.check(
            w["idle_cpu_share"], TARGETS["idle_cpu_share"], at_least=False)
    return checks


def commit() -> str | None:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True)
    return out.stdout.strip() or None


def report(profile: dict[str, Any], quick: bool, workloads: list[dict[str, Any]],
           seconds: float) -> int:
    out: dict[str, Any] = {"profile": "quick" if quick else "full", **profile,
                           "commit": commit(), "cpus": os.cpu_count(), "targets": TARGETS,
                           "workloads": workloads, "checks": checks_of(workloads),
                           "seconds": round(seconds, 1)}
    path = results.write("efficiency-quick" if quick else "efficiency", out)
    print(results.table(workloads, list(COLUMNS)))
    print("\nPer CPU-second (what another load on the machine moves least):")
    print(results.table(workloads, ["name", "ratio_per_cpu", "island_cpu_step_ratio",
                                    "island_cpu_ms_per_step", "bare_cpu_ms_per_step"]))
    print("\nCPU share of the machine while training, by kind:")
    print(results.table([{"name": w["name"], **w["cpu_share"]} for w in workloads],
                        ["name", *KINDS]))
    print()
    print(results.checks_table(out["checks"]))
    print(f"\n{out['seconds']} s on {out['cpus']} cpus, commit {out['commit']}; wrote {path}")
    return results.exit_code(out["checks"])


def main(quick: bool = False, home: Path = HOME) -> int:
    profile = PROFILES["quick" if quick else "full"]
    started = time.time()
    results.say(f"efficiency: python -m webapp.start under {home}")
    system = StartedSystem(home, list(REGIONS))
    try:
        system.setup_django()
        stop_demo(system)
        corpus = make_corpus(home / "data" / "corpus.txt")
        load_corpus(str(corpus), RunConfig().data.eval_fraction, data_dir())  # prepared once, here
        workloads = [measure(system, name, corpus, profile) for name in WORKLOADS]
    finally:
        system.stop()
    return report(profile, quick, workloads, time.time() - started)


def bare_loop(spec: dict[str, Any]) -> None:
    """One bare loop of the workload in `spec` (see the module's docstring)."""
    import torch

    from bench.overhead import BareLoop
    from diloco.config_parse import parse_config
    from diloco.island import initial_model
    from syncd.malloc import return_large_frees

    torch.set_num_threads(1)  # as an island process
    return_large_frees(keep_heap=True)  # its allocator too: a baseline gets what the system gets
    config = parse_config(run_config(spec["model"], spec["corpus"],
                                     spec.get("batch_size", BATCH_SIZE)), list(REGIONS))
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    loop = BareLoop(config, corpus, initial_model(config).state_dict(), clip=True)
    for _ in range(3):  # warm: the allocator, AdamW's state
        loop.step()
    print("ready", flush=True)
    seconds = float(sys.stdin.readline())
    clock = time.perf_counter
    started, cpu, steps = clock(), time.process_time(), 0
    while clock() - started < seconds:
        loop.step()
        steps += 1
    print(json.dumps({"steps": steps, "seconds": clock() - started,
                      "cpu_s": time.process_time() - cpu}), flush=True)


if __name__ == "__main__":
    bare_loop(json.loads(sys.argv[1]))
