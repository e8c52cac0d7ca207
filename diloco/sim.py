"""Datacenter-scale goodput simulator: learners of many chips on a virtual clock.

Decoupled DiLoCo (arXiv 2604.21428) compares, in simulation, how much of a
very large allocation does useful training when chips fail: plain
data-parallel, elastic data-parallel and decoupled learners. This module is
that simulation, discrete-event and seeded. Each chip is interrupted on
average once per `mtbi_s`; an interruption takes out the chip's slice (the
data-parallel replica it belongs to), which comes back `return_s` later.

- dp: one job on every chip. Any interruption stops everyone; the job restarts
  on spare hardware after `restart_s` from its last in-memory checkpoint, and
  the steps since then are lost.
- elastic: one job that drops the failed slice (everyone pauses `downscale_s`),
  trains on with the others, and takes the slice back when it returns
  (everyone pauses `upscale_s`).
- decoupled: M learners, each elastic in that way on its own, that send
  fragment updates over a wide-area link to a synchronizer. The synchronizer
  is the live one's logic: `diloco.policy.decide` (quorum and grace window),
  `diloco.policy.is_stale` and `diloco.merge.merge_weights`, looked up at call
  time so that what is simulated is the code that runs.

Goodput and uptime come from `diloco.accounting.RunAccounting`, as docs/FIGURES.md
defines them: a step of a learner with u of its n slices up is worth u/n of a
fault-free step, and counts once merged (dp: once checkpointed). Uptime's theta
follows the live rule for every method: twice a fragment's cadence, H steps at the
step time of the K-th fastest learner (dp and elastic merge the whole model every
step, so theta is two steps).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import asdict, dataclass, field, replace

from diloco import merge, policy
from diloco.accounting import RunAccounting, fragment_cadence, uptime_theta
from diloco.simconfig import SimConfig


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
        return {"method": self.config.method, "learners": self.config.learners,
                "chips": self.config.chips, "goodput": self.goodput, "uptime": self.uptime,
                "failures": self.failures, "merges": self.merges,
                "stale_drops": self.stale_drops}

    def as_dict(self) -> dict:
        return {**self.row(), "theta_s": self.theta_s, "lost_s": self.lost_s,
                "config": asdict(self.config)}


@dataclass
class _Learner:
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
        per_learner = config.chips / config.learners
        slices = max(1, round(per_learner / config.slice_chips))
        self.fail_rate = per_learner / config.mtbi_s
        self.learners = [_Learner(f"learner-{i}", slices, slices, [0] * config.fragments,
                                  [[0, 0] for _ in range(config.fragments)])
                         for i in range(config.learners)]
        self.acc = RunAccounting([learner.name for learner in self.learners], 0.0,
                                 fragments=config.fragments if config.method == "decoupled"
                                 else 1)
        for learner in self.learners:  # a slice-step is worth 1/n of a fault-free step
            self.acc.observe_step_time(learner.name, config.step_time_s / slices, faulted=False)
        self.versions = [0] * config.fragments
        self.rounds: list[dict[str, tuple[float, int, int, int]]] = [
            {} for _ in range(config.fragments)]
        self.deadlines: list[float | None] = [None] * config.fragments
        self.offsets = [config.inner_steps * (p + 1) // config.fragments % config.inner_steps
                        for p in range(config.fragments)]
        self.failures = self.merges = self.stale_drops = 0
        for at, i in failures:
            if not 0 <= i < config.learners:
                raise ValueError(f"a failure names learner {i}; there are {config.learners}")
            self.push(at, "failure", i, False)

    def push(self, time: float, kind: str, *args: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time, self.seq, kind, args))

    def run(self) -> RunAccounting:
        for i, learner in enumerate(self.learners):
            self._steady_start(i)
            self._next_failure(i, 0.0)
            self._schedule_step(learner, 0.0)
        end = self.c.duration_s
        while self.events and self.events[0][0] <= end:
            time, _, kind, args = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(time, *args)
        for learner in self.learners:
            self._advance(learner, end)
        self.acc.finish(end)
        return self.acc

    # -- a learner's steps --------------------------------------------------------------

    def _advance(self, learner: _Learner, now: float) -> None:
        """Count the whole steps done since `running_since`; a partial step stays open."""
        if learner.running_since is None:
            return
        t = self.c.step_time_s
        done = int((now - learner.running_since) / t + 1e-9)
        for k in range(1, done + 1):
            self._step_done(learner, learner.running_since + k * t)
        learner.running_since += done * t

    def _step_done(self, learner: _Learner, at: float) -> None:
        learner.steps += 1
        if self.c.method == "elastic":
            self.acc.merged(learner.name, learner.up, 1.0, at)
        elif self.c.method == "dp":
            learner.unsaved.append((at, learner.up))
            if learner.steps % self.c.checkpoint_steps == 0:
                for when, up in learner.unsaved:
                    self.acc.merged(learner.name, up, 1.0, when)
                learner.unsaved.clear()
        else:
            for counts in learner.since:
                counts[0] += learner.up
                counts[1] += 1

    def _stop(self, learner: _Learner, now: float) -> None:
        """Stop training now; the step in progress is lost."""
        self._advance(learner, now)
        learner.running_since = None
        learner.gen += 1

    def _start(self, learner: _Learner, now: float) -> None:
        if now < learner.paused_until or learner.running_since is not None:
            return
        if any(step <= learner.steps for step in learner.need.values()):
            if learner.blocked_since is None:
                learner.blocked_since = now
            return
        if learner.blocked_since is not None:
            self.acc.lost(learner.name, now - learner.blocked_since, "barrier_wait")
            learner.blocked_since = None
        learner.running_since = now
        self._schedule_step(learner, now)

    def _schedule_step(self, learner: _Learner, now: float) -> None:
        """The next step at which a decoupled learner sends or needs a merge."""
        if self.c.method != "decoupled" or learner.running_since is None:
            return
        learner.gen += 1
        h, s = self.c.inner_steps, learner.steps
        target = min(s + ((off - s) % h or h) for off in self.offsets)
        target = min([target, *(n for n in learner.need.values() if n > s)])
        at = learner.running_since + (target - s) * self.c.step_time_s
        self.push(at, "step", learner, learner.gen)

    def _on_step(self, now: float, learner: _Learner, gen: int) -> None:
        if gen != learner.gen:
            return
        self._advance(learner, now)
        for p, off in enumerate(self.offsets):
            if learner.steps % self.c.inner_steps == off:
                self._send(learner, p, now)
        if any(step <= learner.steps for step in learner.need.values()):
            self._stop(learner, now)
            self._start(learner, now)  # records when it began to wait
        else:
            self._schedule_step(learner, now)

    # -- interruptions ------------------------------------------------------------------

    def _next_failure(self, i: int, now: float) -> None:
        if self.fail_rate > 0:
            self.push(now + self.rng.expovariate(self.fail_rate), "failure", i)

    def _steady_start(self, i: int) -> None:
        """Start with the slices that interruptions in the last return_s took out still out,
        so that a short run measures the steady state and not a fresh allocation."""
        if self.c.method == "dp" or self.fail_rate == 0:
            return  # dp restarts on spares: all of its slices are always up
        learner = self.learners[i]
        t = -self.c.return_s + self.rng.expovariate(self.fail_rate)
        while t < 0:
            if self.rng.random() < learner.up / learner.slices:
                learner.up -= 1
                self.push(t + self.c.return_s, "return", i)
            t += self.rng.expovariate(self.fail_rate)

    def _on_failure(self, now: float, i: int, random_: bool = True) -> None:
        learner = self.learners[i]
        if not random_:  # a scripted failure (simulate's `failures`)
            self._fail(learner, i, now)
            return
        self._next_failure(i, now)
        # Chips of slices already down cannot be interrupted again (thinning).
        if self.rng.random() < learner.up / learner.slices:
            self._fail(learner, i, now)

    def _fail(self, learner: _Learner, i: int, now: float) -> None:
        self.failures += 1
        if self.c.method == "dp":
            if now < learner.paused_until:
                return  # the restart in progress lands on healthy spares anyway
            self._stop(learner, now)
            self.acc.lost(learner.name, len(learner.unsaved) * self.c.step_time_s, "rollback")
            learner.steps -= len(learner.unsaved)
            learner.unsaved.clear()
            self._pause(learner, now, self.c.restart_s)
            return
        if learner.up == 0:
            return  # every slice is already out
        self._advance(learner, now)  # the steps done so far had the slice
        learner.up -= 1
        self.push(now + self.c.return_s, "return", i)
        self._pause(learner, now, self.c.downscale_s)

    def _on_return(self, now: float, i: int) -> None:
        learner = self.learners[i]
        self._advance(learner, now)
        learner.up += 1
        if self.c.upscale_s > 0:
            self._pause(learner, now, self.c.upscale_s)

    def _pause(self, learner: _Learner, now: float, seconds: float) -> None:
        was_live = now >= learner.paused_until
        self._stop(learner, now)
        if learner.blocked_since is not None:  # from here on the pause is the cause
            self.acc.lost(learner.name, now - learner.blocked_since, "barrier_wait")
            learner.blocked_since = None
        until = max(learner.paused_until, now + seconds)
        self.acc.lost(learner.name, until - max(now, learner.paused_until), "restart_pause")
        learner.paused_until = until
        self.push(until, "resume", learner)
        if was_live and self.c.method == "decoupled":
            for p in range(self.c.fragments):  # fewer live learners: a round may close
                self._try_merge(p, now)

    def _on_resume(self, now: float, learner: _Learner) -> None:
        self._start(learner, now)

    # -- the synchronizer ---------------------------------------------------------------

    def _send(self, learner: _Learner, p: int, now: float) -> None:
        slice_steps, steps = learner.since[p]
        learner.since[p] = [0, 0]
        if slice_steps == 0:
            return  # every slice of the learner is out: it trained nothing to send
        start = max(now, learner.uplink_free)
        learner.uplink_free = start + self.c.fragment_seconds
        learner.need[p] = learner.steps + self.c.overlap_steps
        self.push(learner.uplink_free + self.c.latency_s, "arrive", learner, p,
                  learner.held[p], slice_steps, steps)

    def _on_arrive(self, now: float, learner: _Learner, p: int, base: int, slice_steps: int,
                   steps: int) -> None:
        if policy.is_stale(base, self.versions[p], self.c.max_staleness):
            self._drop(learner, p, slice_steps, now)
            return
        # A learner waits for the merge of each update before its next send of the
        # same fragment (overlap_steps < inner_steps), so a round holds one per learner.
        self.rounds[p][learner.name] = (now, base, slice_steps, steps)
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
        live = sum(now >= learner.paused_until for learner in self.learners)
        sync_s = self.c.fragment_seconds + self.c.latency_s
        stats = policy.RoundStats(self.c.step_time_s,
                                  2 * sync_s if self.c.grace_round_trip else sync_s)
        decision = policy.decide(arrivals, now, min_quorum=self.c.min_quorum,
                                 live_islands=live, gamma=self.c.grace_gamma,
                                 overlap_steps=self.c.overlap_steps, stats=stats)
        if decision.merge:
            self._merge(p, now)
        elif decision.deadline is not None and decision.deadline != self.deadlines[p]:
            self.deadlines[p] = decision.deadline
            self.push(decision.deadline, "deadline", p)

    def _merge(self, p: int, now: float) -> None:
        round_, self.rounds[p] = self.rounds[p], {}
        by_name = {learner.name: learner for learner in self.learners}
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

    def _drop(self, learner: _Learner, p: int, slice_steps: int, now: float) -> None:
        self.stale_drops += 1
        value = slice_steps / self.c.fragments * self.c.step_time_s / learner.slices
        self.acc.lost(learner.name, value, "stale")
        self._publish(learner, p, now)

    def _publish(self, learner: _Learner, p: int, now: float) -> None:
        """The learner pulls the newest version of fragment p over its downlink."""
        start = max(now, learner.downlink_free)
        learner.downlink_free = start + self.c.fragment_seconds
        self.push(learner.downlink_free + self.c.latency_s, "pulled", learner, p,
                  self.versions[p])

    def _on_pulled(self, now: float, learner: _Learner, p: int, version: int) -> None:
        learner.held[p] = max(learner.held[p], version)
        learner.need.pop(p, None)
        if learner.blocked_since is not None:
            self._start(learner, now)


def simulate(config: SimConfig, failures: tuple[tuple[float, int], ...] = ()) -> SimResult:
    """Run one configuration and measure its goodput and uptime.

    `failures` adds scripted interruptions, (time, learner index) each, to the random ones.
    """
    sim = _Sim(config, failures)
    acc = sim.run()
    theta = uptime_theta(cadence(config))
    snapshot = acc.snapshot(config.duration_s, theta)
    return SimResult(config, snapshot["goodput"] or 0.0, snapshot["uptime"] or 0.0, theta,
                     sim.failures, sim.merges if config.method == "decoupled" else 0,
                     sim.stale_drops, snapshot["lost_s"])


def utilization(config: SimConfig) -> float:
    """Compute utilization without interruptions: the share of the wall time the learners
    spend on inner steps rather than waiting on the link and the merges."""
    sim = _Sim(replace(config, mtbi_s=math.inf))
    sim.run()
    steps = sum(learner.steps for learner in sim.learners)
    return steps * config.step_time_s / (config.learners * config.duration_s)


def cadence(config: SimConfig) -> float:
    """A fragment's cadence, by the live rule (diloco.accounting.fragment_cadence): H steps
    at the step time of the K-th fastest learner, every learner stepping at step_time_s;
    dp and elastic merge the whole model every step."""
    steps = config.inner_steps if config.method == "decoupled" else 1
    return fragment_cadence([config.step_time_s] * config.learners, steps,
                            min(config.min_quorum, config.learners))
