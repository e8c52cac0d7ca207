"""Datacenter-scale goodput simulator: islands of many chips on a virtual clock.

Decoupled DiLoCo (arXiv 2604.21428) compares, in simulation, how much of a
very large allocation does useful training when chips fail: plain
data-parallel, elastic data-parallel and decoupled islands. This module is
that simulation, discrete-event and seeded. Each chip is interrupted on
average once per `mtbi_s`; an interruption takes out the chip's slice (the
data-parallel replica it belongs to), which comes back `return_s` later.

- dp: one job on every chip. Any interruption stops everyone; the job restarts
  on spare hardware after `restart_s` from its last in-memory checkpoint, and
  the steps since then are lost.
- elastic: one job that drops the failed slice (everyone pauses `downscale_s`),
  trains on with the others, and takes the slice back when it returns
  (everyone pauses `upscale_s`).
- decoupled: M islands, each elastic in that way on its own, that send
  fragment updates over a wide-area link to a synchronizer. The synchronizer
  is syncd's logic: `diloco.policy.decide` (quorum and grace window),
  `diloco.policy.is_stale` and `diloco.merge.merge_weights`, looked up at call
  time so that what is simulated is the code that runs.

Goodput and uptime come from `diloco.accounting.RunAccounting`, as docs/FIGURES.md
defines them: a step of an island with u of its n slices up is worth u/n of a
fault-free step, and counts once merged (dp: once checkpointed). Uptime's theta
follows syncd's rule for every mode: twice a fragment's cadence, H steps at the
step time of the K-th fastest island (dp and elastic merge the whole model every
step, so theta is two steps).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import asdict, dataclass, field, replace

from diloco import merge, policy
from diloco.accounting import RunAccounting
from diloco.simconfig import SimConfig
from diloco.uptime import fragment_cadence, uptime_theta


@dataclass(frozen=True)
class SimResult:
    """What one run measured; goodput and uptime as docs/FIGURES.md defines them."""

    config: SimConfig
    goodput: float
    uptime: float
    theta_s: float
    failures: int
    merges: int
    stale_drops: int
    lost_s: dict[str, float]

    def row(self) -> dict:
        return {"mode": self.config.mode, "islands": self.config.islands,
                "chips": self.config.chips, "goodput": self.goodput, "uptime": self.uptime,
                "failures": self.failures, "merges": self.merges,
                "stale_drops": self.stale_drops}

    def as_dict(self) -> dict:
        return {**self.row(), "theta_s": self.theta_s, "lost_s": self.lost_s,
                "config": asdict(self.config)}


@dataclass
class _Island:
    name: str
    slices: int
    up: int
    held: list[int]  # the global version held, per fragment
    since: list[list[int]]  # per fragment: [slice-steps, steps] not sent yet
    running_since: float | None = 0.0  # start of the current step, None while stopped
    paused_until: float = 0.0
    blocked_since: float | None = None
    steps: int = 0
    gen: int = 0  # bumps whenever the next step event changes
    uplink_free: float = 0.0
    downlink_free: float = 0.0
    need: dict[int, int] = field(default_factory=dict)  # fragment -> step its merge is due
    unsaved: list[tuple[float, int]] = field(default_factory=list)  # dp: (time, up) per step


class _Sim:
    """The event loop of one run; `run` drives it."""

    def __init__(self, config: SimConfig, failures: tuple[tuple[float, int], ...] = ()) -> None:
        self.c = config
        self.rng = random.Random(config.seed)
        self.events: list[tuple[float, int, str, tuple]] = []
        self.seq = 0
        per_island = config.chips / config.islands
        slices = max(1, round(per_island / config.slice_chips))
        self.fail_rate = per_island / config.mtbi_s
        self.islands = [_Island(f"island-{i}", slices, slices, [0] * config.fragments,
                                [[0, 0] for _ in range(config.fragments)])
                        for i in range(config.islands)]
        self.acc = RunAccounting([island.name for island in self.islands], 0.0,
                                 fragments=config.fragments if config.mode == "decoupled"
                                 else 1)
        for island in self.islands:  # a slice-step is worth 1/n of a fault-free step
            self.acc.observe_step_time(island.name, config.step_time_s / slices, faulted=False)
        self.versions = [0] * config.fragments
        self.rounds: list[dict[str, tuple[float, int, int, int]]] = [
            {} for _ in range(config.fragments)]
        self.deadlines: list[float | None] = [None] * config.fragments
        self.offsets = [config.inner_steps * (p + 1) // config.fragments % config.inner_steps
                        for p in range(config.fragments)]
        self.failures = self.merges = self.stale_drops = 0
        for at, i in failures:
            if not 0 <= i < config.islands:
                raise ValueError(f"a failure names island {i}; there are {config.islands}")
            self.push(at, "failure", i, False)

    def push(self, time: float, kind: str, *args: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time, self.seq, kind, args))

    def run(self) -> RunAccounting:
        for i, island in enumerate(self.islands):
            self._steady_start(i)
            self._next_failure(i, 0.0)
            self._schedule_step(island, 0.0)
        end = self.c.duration_s
        while self.events and self.events[0][0] <= end:
            time, _, kind, args = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(time, *args)
        for island in self.islands:
            self._advance(island, end)
        self.acc.clock.finish(end)
        return self.acc

    # -- an island's steps --------------------------------------------------------------

    def _advance(self, island: _Island, now: float) -> None:
        """Count the whole steps done since `running_since`; a partial step stays open."""
        if island.running_since is None:
            return
        t = self.c.step_time_s
        done = int((now - island.running_since) / t + 1e-9)
        for k in range(1, done + 1):
            self._step_done(island, island.running_since + k * t)
        island.running_since += done * t

    def _step_done(self, island: _Island, at: float) -> None:
        island.steps += 1
        if self.c.mode == "elastic":
            self.acc.merged(island.name, island.up, 1.0, at)
        elif self.c.mode == "dp":
            island.unsaved.append((at, island.up))
            if island.steps % self.c.checkpoint_steps == 0:
                for when, up in island.unsaved:
                    self.acc.merged(island.name, up, 1.0, when)
                island.unsaved.clear()
        else:
            for counts in island.since:
                counts[0] += island.up
                counts[1] += 1

    def _stop(self, island: _Island, now: float) -> None:
        """Stop training now; the step in progress is lost."""
        self._advance(island, now)
        island.running_since = None
        island.gen += 1

    def _start(self, island: _Island, now: float) -> None:
        if now < island.paused_until or island.running_since is not None:
            return
        if any(step <= island.steps for step in island.need.values()):
            if island.blocked_since is None:
                island.blocked_since = now
            return
        if island.blocked_since is not None:
            self.acc.lost(island.name, now - island.blocked_since, "barrier_wait")
            island.blocked_since = None
        island.running_since = now
        self._schedule_step(island, now)

    def _schedule_step(self, island: _Island, now: float) -> None:
        """The next step at which a decoupled island sends or needs a merge."""
        if self.c.mode != "decoupled" or island.running_since is None:
            return
        island.gen += 1
        h, s = self.c.inner_steps, island.steps
        target = min(s + ((off - s) % h or h) for off in self.offsets)
        target = min([target, *(n for n in island.need.values() if n > s)])
        at = island.running_since + (target - s) * self.c.step_time_s
        self.push(at, "step", island, island.gen)

    def _on_step(self, now: float, island: _Island, gen: int) -> None:
        if gen != island.gen:
            return
        self._advance(island, now)
        for p, off in enumerate(self.offsets):
            if island.steps % self.c.inner_steps == off:
                self._send(island, p, now)
        if any(step <= island.steps for step in island.need.values()):
            self._stop(island, now)
            self._start(island, now)  # records when it began to wait
        else:
            self._schedule_step(island, now)

    # -- interruptions ------------------------------------------------------------------

    def _next_failure(self, i: int, now: float) -> None:
        if self.fail_rate > 0:
            self.push(now + self.rng.expovariate(self.fail_rate), "failure", i)

    def _steady_start(self, i: int) -> None:
        """Start with the slices that interruptions in the last return_s took out still out,
        so that a short run measures the steady state and not a fresh allocation."""
        if self.c.mode == "dp" or self.fail_rate == 0:
            return  # dp restarts on spares: all of its slices are always up
        island = self.islands[i]
        t = -self.c.return_s + self.rng.expovariate(self.fail_rate)
        while t < 0:
            if self.rng.random() < island.up / island.slices:
                island.up -= 1
                self.push(t + self.c.return_s, "return", i)
            t += self.rng.expovariate(self.fail_rate)

    def _on_failure(self, now: float, i: int, random_: bool = True) -> None:
        island = self.islands[i]
        if not random_:  # a scripted failure (simulate's `failures`)
            self._fail(island, i, now)
            return
        self._next_failure(i, now)
        # Chips of slices already down cannot be interrupted again (thinning).
        if self.rng.random() < island.up / island.slices:
            self._fail(island, i, now)

    def _fail(self, island: _Island, i: int, now: float) -> None:
        self.failures += 1
        if self.c.mode == "dp":
            if now < island.paused_until:
                return  # the restart in progress lands on healthy spares anyway
            self._stop(island, now)
            self.acc.lost(island.name, len(island.unsaved) * self.c.step_time_s, "rollback")
            island.steps -= len(island.unsaved)
            island.unsaved.clear()
            self._pause(island, now, self.c.restart_s)
            return
        if island.up == 0:
            return  # every slice is already out
        self._advance(island, now)  # the steps done so far had the slice
        island.up -= 1
        self.push(now + self.c.return_s, "return", i)
        self._pause(island, now, self.c.downscale_s)

    def _on_return(self, now: float, i: int) -> None:
        island = self.islands[i]
        self._advance(island, now)
        island.up += 1
        if self.c.upscale_s > 0:
            self._pause(island, now, self.c.upscale_s)

    def _pause(self, island: _Island, now: float, seconds: float) -> None:
        was_live = now >= island.paused_until
        self._stop(island, now)
        if island.blocked_since is not None:  # from here on the pause is the cause
            self.acc.lost(island.name, now - island.blocked_since, "barrier_wait")
            island.blocked_since = None
        until = max(island.paused_until, now + seconds)
        self.acc.lost(island.name, until - max(now, island.paused_until), "restart_pause")
        island.paused_until = until
        self.push(until, "resume", island)
        if was_live and self.c.mode == "decoupled":
            for p in range(self.c.fragments):  # fewer alive islands: a round may close
                self._try_merge(p, now)

    def _on_resume(self, now: float, island: _Island) -> None:
        self._start(island, now)

    # -- the synchronizer ---------------------------------------------------------------

    def _send(self, island: _Island, p: int, now: float) -> None:
        slice_steps, steps = island.since[p]
        island.since[p] = [0, 0]
        if slice_steps == 0:
            return  # every slice of the island is out: it trained nothing to send
        start = max(now, island.uplink_free)
        island.uplink_free = start + self.c.fragment_seconds
        island.need[p] = island.steps + self.c.overlap_steps
        self.push(island.uplink_free + self.c.latency_s, "arrive", island, p,
                  island.held[p], slice_steps, steps)

    def _on_arrive(self, now: float, island: _Island, p: int, base: int, slice_steps: int,
                   steps: int) -> None:
        if policy.is_stale(base, self.versions[p], self.c.max_staleness):
            self._drop(island, p, slice_steps, now)
            return
        # An island waits for the merge of each update before its next send of the
        # same fragment (overlap_steps < inner_steps), so a round holds one per island.
        self.rounds[p][island.name] = (now, base, slice_steps, steps)
        self._try_merge(p, now)

    def _on_deadline(self, now: float, p: int) -> None:
        if self.deadlines[p] == now:
            self.deadlines[p] = None
            self._try_merge(p, now)

    def _try_merge(self, p: int, now: float) -> None:
        round_ = self.rounds[p]
        if not round_:
            return
        arrivals = [policy.Arrival(name, t, base) for name, (t, base, _, _) in round_.items()]
        alive = sum(now >= island.paused_until for island in self.islands)
        sync_s = self.c.fragment_seconds + self.c.latency_s
        stats = policy.RoundStats(self.c.step_time_s,
                                  2 * sync_s if self.c.grace_round_trip else sync_s)
        decision = policy.decide(arrivals, now, min_quorum=self.c.min_quorum,
                                 alive_islands=alive, gamma=self.c.grace_gamma,
                                 overlap_steps=self.c.overlap_steps, stats=stats)
        if decision.merge:
            self._merge(p, now)
        elif decision.deadline is not None and decision.deadline != self.deadlines[p]:
            self.deadlines[p] = decision.deadline
            self.push(decision.deadline, "deadline", p)

    def _merge(self, p: int, now: float) -> None:
        round_, self.rounds[p] = self.rounds[p], {}
        by_name = {island.name: island for island in self.islands}
        fresh = {}
        for name, (_, base, slice_steps, steps) in round_.items():
            if policy.is_stale(base, self.versions[p], self.c.max_staleness):
                self._drop(by_name[name], p, slice_steps, now)
            else:
                fresh[name] = (slice_steps, steps)
        if not fresh:
            return
        updates = [merge.Update(name, 0, ss, st, {}) for name, (ss, st) in fresh.items()]
        weights = merge.merge_weights(updates, self.c.weighting)
        self.versions[p] += 1
        self.merges += 1
        for name, (slice_steps, _) in fresh.items():
            self.acc.merged(name, slice_steps, weights[name], now, fragment=p,
                            version=self.versions[p])
            self._publish(by_name[name], p, now)

    def _drop(self, island: _Island, p: int, slice_steps: int, now: float) -> None:
        self.stale_drops += 1
        value = slice_steps / self.c.fragments * self.c.step_time_s / island.slices
        self.acc.lost(island.name, value, "stale")
        self._publish(island, p, now)

    def _publish(self, island: _Island, p: int, now: float) -> None:
        """The island pulls the newest version of fragment p over its downlink."""
        start = max(now, island.downlink_free)
        island.downlink_free = start + self.c.fragment_seconds
        self.push(island.downlink_free + self.c.latency_s, "pulled", island, p,
                  self.versions[p])

    def _on_pulled(self, now: float, island: _Island, p: int, version: int) -> None:
        island.held[p] = max(island.held[p], version)
        island.need.pop(p, None)
        if island.blocked_since is not None:
            self._start(island, now)


def simulate(config: SimConfig, failures: tuple[tuple[float, int], ...] = ()) -> SimResult:
    """Run one configuration and measure its goodput and uptime.

    `failures` adds scripted interruptions, (time, island index) each, to the random ones.
    """
    sim = _Sim(config, failures)
    acc = sim.run()
    theta = uptime_theta(cadence(config))
    snapshot = acc.snapshot(config.duration_s, theta)
    return SimResult(config, snapshot["goodput"] or 0.0, snapshot["uptime"] or 0.0, theta,
                     sim.failures, sim.merges if config.mode == "decoupled" else 0,
                     sim.stale_drops, snapshot["lost_s"])


def utilization(config: SimConfig) -> float:
    """Compute utilization without interruptions: the share of the wall time the islands
    spend on inner steps rather than waiting on the link and the merges."""
    sim = _Sim(replace(config, mtbi_s=math.inf))
    sim.run()
    steps = sum(island.steps for island in sim.islands)
    return steps * config.step_time_s / (config.islands * config.duration_s)


def cadence(config: SimConfig) -> float:
    """A fragment's cadence, by syncd's rule (diloco.uptime.fragment_cadence): H steps
    at the step time of the K-th fastest island, every island stepping at step_time_s;
    dp and elastic merge the whole model every step."""
    steps = config.inner_steps if config.mode == "decoupled" else 1
    return fragment_cadence([config.step_time_s] * config.islands, steps,
                            min(config.min_quorum, config.islands))
