"""Goodput and uptime, per island and per run, as docs/FIGURES.md defines them.

Goodput = useful island-seconds / allocated island-seconds. Useful: the inner
steps merged into the global model with a weight above zero and never rolled
back, valued at the island's fault-free seconds per step measured in the same
run. Allocated: every island slot from run start to run end, whatever its state;
only a user's pause is left out. Uptime: the share of the time after start-up
(the run's start to its first merge) in which the global model advances: per
a gap between successive merges of any fragment (the global model advancing) counts
as down when it exceeds theta, at least twice a fragment's cadence (H inner steps
at the step time of the K-th fastest island), judged against the largest theta in
force while it was open. Pure: no
Django, Celery, Redis or clock; every method takes `now` in seconds on the
caller's clock (syncd's or a virtual one).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from diloco.uptime import checked_seconds, fragment_cadence, uptime_from_marks

LOST_CAUSES = ("in_flight", "stale", "rejected", "rollback", "restart_pause", "barrier_wait")
# Useful seconds within this share above allocated ones are rounding, not a bug.
OVERCREDIT_TOLERANCE = 1e-6


def _total(seconds: list[float | None]) -> float | None:
    """The sum of `seconds`, or None when one of them is unknown."""
    return None if None in seconds else math.fsum(s for s in seconds if s is not None)


@dataclass(frozen=True, slots=True)
class MergeEntry:
    """One island's update merged into the global model at `time`: it carried
    `inner_steps`, of which `credited_steps` were trained inside the accounting's
    window (RunAccounting.trained_before)."""

    time: float
    island: str
    inner_steps: int
    credited_steps: int
    weight: float
    fragment: int | None = None
    version: int | None = None


@dataclass
class _Island:
    windows: list[list[float | None]]  # [added, removed or None]
    step_times: deque[tuple[float, int]]  # fault-free (seconds, steps), the latest ones
    # fragment (None: every fragment) -> its steps up to this one were trained before
    # the accounting's window: no merge credits them.
    trained_before: dict[int | None, int] = field(default_factory=dict)
    useful_steps: float = 0.0
    rolled_back_steps: float = 0.0
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOST_CAUSES, 0.0))


class RunClock:
    """A run's wall time on the caller's clock: from its start to its end, a user's
    pauses left out."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.end: float | None = None
        self.pauses: list[list[float | None]] = []  # [paused, resumed or None]

    @property
    def paused(self) -> bool:  # by the user
        return bool(self.pauses) and self.pauses[-1][1] is None

    def pause(self, now: float) -> None:
        """A user's pause from `now`: left out of every island's allocation and of wall time."""
        now = self.check(now)
        if self.paused:
            raise ValueError("the run is already paused")
        self.pauses.append([now, None])

    def resume(self, now: float) -> None:
        """End the user's pause at `now`."""
        if not self.paused:
            raise ValueError("the run is not paused")
        self.pauses[-1][1] = max(self.check(now), self.pauses[-1][0])

    def finish(self, now: float) -> None:
        """The run's end: allocation and wall time stop at `now` (an open pause ends too)."""
        now = self.check(now)
        if self.end is not None:
            raise ValueError(f"the run already ended at {self.end}")
        if self.paused:
            self.pauses[-1][1] = now
        self.end = now

    def wall_seconds(self, now: float) -> float:
        """Seconds from the run's start to `now` (or its end), pauses left out."""
        return self.active(self.check(now))

    def check(self, now: float) -> float:
        """`now`, refused unless finite and not before the start."""
        now = float(now)
        if not math.isfinite(now) or now < self.start:
            raise ValueError(f"time must be finite, not before the start {self.start}: {now}")
        return now

    def active(self, t: float) -> float:
        """Seconds from the start to `t` (at most the end), pauses left out."""
        t = t if self.end is None else min(t, self.end)
        paused = sum(max(0.0, (t if b is None else min(b, t)) - a) for a, b in self.pauses)
        return t - self.start - paused


class RunAccounting:
    """Goodput and uptime of one run, fed by syncd, the in-process cluster or a simulator.

    A step is valued at the island's mean fault-free step time, weighted by steps
    (its fault-free seconds over its fault-free steps; while it has none, every
    island's), never at its own report. Not the median: under bursty load short
    samples outnumber long ones and the median undervalues every step. A user's pause is left
    out of allocation, gaps and wall time. Start-up, from the run's start to its first
    merge, is a figure of its own and no part of uptime; after it, the open gap since
    the last merge of any fragment counts up to `now` once it exceeds theta.

    Useful seconds are credited, never clipped: only steps trained inside the window
    count (`trained_before` names the steps a taken-over run trained earlier), and an
    island whose useful seconds exceed its allocated seconds is a bug the snapshot
    reports (`overcredited`), not a figure it hides.

    Args:
        islands: the names of the islands allocated from `start`.
        start: the run's start, in seconds on the caller's clock.
        step_time_window: the latest fault-free step time samples kept per island.
        fragments: P. Every inner step is in the update of each of the P fragments,
            so a merge of one fragment stands for 1/P of the steps it carries.
    """

    def __init__(self, islands: Iterable[str], start: float, *,
                 step_time_window: int = 1024, fragments: int = 1) -> None:
        if fragments < 1:
            raise ValueError(f"fragments must be 1 or more, got {fragments}")
        self.fragments = fragments
        if step_time_window < 1:
            raise ValueError(f"step_time_window must be 1 or more, got {step_time_window}")
        self.clock = RunClock(checked_seconds("start", start))
        self.step_time_window = step_time_window
        self.islands: dict[str, _Island] = {}
        self.entries: list[MergeEntry] = []
        self.first_merge: float | None = None  # ends start-up; a rollback keeps it
        self.thetas: list[tuple[float, float]] = []  # (wall second, theta) as noted
        for island in islands:
            self.add_island(island, self.clock.start)

    def add_island(self, island: str, now: float) -> None:
        """Allocate `island` from `now` on (again, if it was removed)."""
        now = self.clock.check(now)
        if self.clock.end is not None:
            raise ValueError(f"the run ended at {self.clock.end}; no island can be added")
        state = self.islands.get(island)
        if state is None:
            self.islands[island] = _Island([[now, None]], deque(maxlen=self.step_time_window))
        elif state.windows[-1][1] is None:
            raise ValueError(f"island {island!r} is already allocated")
        else:
            state.windows.append([now, None])

    def remove_island(self, island: str, now: float) -> None:
        """End `island`'s allocation at `now`; its merged steps stay useful."""
        window = self._island(island).windows[-1]
        if window[1] is not None:
            raise ValueError(f"island {island!r} was already removed")
        window[1] = max(self.clock.check(now), window[0])

    def observe_step_time(self, island: str, seconds_per_step: float, faulted: bool,
                          steps: int = 1) -> None:
        """`island` took `seconds_per_step` (> 0) per inner step over `steps` steps; only
        steps taken while `faulted` is False (no active fault) value useful steps."""
        state = self._island(island)
        seconds = checked_seconds("seconds_per_step", seconds_per_step, positive=True)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a whole number of 1 or more, got {steps!r}")
        if not faulted:
            state.step_times.append((seconds * steps, steps))

    def trained_before(self, island: str, step: int, *, fragment: int | None = None
                       ) -> None:
        """`island`'s inner steps up to `step` (of `fragment`'s updates, or of every
        fragment's) were trained before this accounting's window began: a syncd that
        took over a running run gives, per fragment, the larger of the seq it had
        handled and the island's last heartbeat step. A merge credits only the steps
        of its update past that."""
        state = self._island(island)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer 0 or more, got {step!r}")
        state.trained_before[fragment] = max(step, state.trained_before.get(fragment, 0))

    def merged(self, island: str, inner_steps: int, weight: float, now: float, *,
               fragment: int | None = None, version: int | None = None,
               seq: int | None = None) -> None:
        """`island`'s update of `inner_steps`, ending at its inner step `seq` (optional),
        was merged with `weight` (useful only above 0) into the global published at `now`
        (an uptime mark) as `fragment` `version` (optional; `fragment` filters `uptime`).
        With `seq`, only its steps past the island's `trained_before` are credited."""
        state = self._island(island)
        if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 0:
            raise ValueError(f"inner_steps must be an integer 0 or more, got {inner_steps!r}")
        weight = float(weight)
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight must be a finite number 0 or more, got {weight}")
        credited = inner_steps
        if seq is not None:
            before = max(state.trained_before.get(fragment, 0),
                         state.trained_before.get(None, 0))
            credited = min(inner_steps, max(seq - before, 0))
        self.entries.append(MergeEntry(self.clock.check(now), island, inner_steps, credited, weight,
                                       fragment, version))
        if self.first_merge is None:
            self.first_merge = self.clock.check(now)
        if weight > 0:
            state.useful_steps += credited / self.fragments

    def merged_round(self, weights: Mapping[str, float], inner_steps: Mapping[str, int],
                     now: float, *, fragment: int | None = None,
                     version: int | None = None,
                     seqs: Mapping[str, int] | None = None) -> None:
        """Every island of one merge (a synchronizer MergeResult's weights, inner_steps
        and seqs)."""
        for island, weight in weights.items():
            self.merged(island, inner_steps.get(island, 0), weight, now,
                        fragment=fragment, version=version,
                        seq=None if seqs is None else seqs.get(island))

    def rollback(self, after_time: float, now: float, *, fragment: int | None = None
                 ) -> float:
        """Take back every merge newer than `after_time` (of `fragment`, or of all): its
        steps count as lost to "rollback", not useful, and it stops being an uptime
        mark. Returns the inner steps taken back."""
        after_time, now = self.clock.check(after_time), self.clock.check(now)
        if after_time > now:
            raise ValueError(f"after_time ({after_time}) must not be later than now ({now})")
        kept, taken = [], 0.0
        for entry in self.entries:
            if entry.time <= after_time or fragment not in (None, entry.fragment):
                kept.append(entry)
            elif entry.weight > 0:
                steps = entry.credited_steps / self.fragments
                self.islands[entry.island].useful_steps -= steps
                self.islands[entry.island].rolled_back_steps += steps
                taken += steps
        self.entries = kept
        return taken

    def lost(self, island: str, seconds: float, cause: str) -> None:
        """`seconds` of `island`'s time lost to `cause`, one of LOST_CAUSES (report
        under "rollback" only work never merged: `rollback` counts merged steps)."""
        state = self._island(island)
        if cause not in LOST_CAUSES:
            raise ValueError(f"cause must be one of {', '.join(LOST_CAUSES)}, got {cause!r}")
        state.lost[cause] += checked_seconds("seconds", seconds)

    def step_time(self, island: str) -> float | None:
        """The fault-free seconds per step that value `island`'s useful steps."""
        own = self._island(island).step_times
        samples = own or [t for state in self.islands.values() for t in state.step_times]
        steps = sum(n for _, n in samples)
        return sum(seconds for seconds, _ in samples) / steps if steps else None

    def allocated_seconds(self, island: str, now: float) -> float:
        """`island`'s allocated seconds up to `now`: its windows, pauses left out."""
        now = self.clock.check(now)
        return sum(self.clock.active(now if b is None else min(b, now)) - self.clock.active(a)
                   for a, b in self._island(island).windows if a <= now)

    def useful_seconds(self, island: str, now: float) -> float | None:
        """`island`'s useful seconds up to `now`, as credited: never clipped at its
        allocated seconds (`overcredited` reports an island above them). None while it
        has useful steps but no step time measured to value them."""
        return self._value(island, self._island(island).useful_steps)

    def overcredited(self, now: float) -> list[str]:
        """The islands credited more useful seconds than they were allocated by `now`: no
        island does more work than the time it was given, so each is a bug in what was
        credited (steps from before the window, a step time valued too slow), shown
        rather than clipped."""
        over = []
        for name in self.islands:
            useful, allocated = self.useful_seconds(name, now), self.allocated_seconds(name, now)
            if useful is not None and useful > allocated * (1 + OVERCREDIT_TOLERANCE) + 1e-9:
                over.append(name)
        return over

    def goodput(self, now: float) -> float | None:
        """Useful / allocated island-seconds of the run (None if unknown or nothing allocated)."""
        useful = _total([self.useful_seconds(name, now) for name in self.islands])
        allocated = sum(self.allocated_seconds(name, now) for name in self.islands)
        return None if useful is None or allocated == 0 else useful / allocated

    def startup_seconds(self, now: float) -> float:
        """Wall seconds from the run's start to its first merge (to `now` before it)."""
        end = now if self.first_merge is None else min(self.first_merge, now)
        return self.clock.wall_seconds(end)

    def cadence(self, inner_steps: int, min_quorum: int) -> float | None:
        """A fragment's cadence: H steps at the step time of the K-th fastest island in
        the run (fragment_cadence); None before any step time is measured."""
        in_run = [name for name, state in self.islands.items() if state.windows[-1][1] is None]
        return fragment_cadence([self.step_time(name) for name in in_run], inner_steps,
                                min(min_quorum, max(len(in_run), 1)))

    def note_theta(self, now: float, theta: float) -> None:
        """`theta` is in force at `now`: every gap open at `now` is judged against at
        least it, whatever theta is later (a slowdown that raised it stays up)."""
        theta, wall = checked_seconds("theta", theta, positive=True), self.clock.wall_seconds(now)
        if not self.thetas or self.thetas[-1][1] != theta:
            self.thetas.append((wall, theta))

    def uptime(self, now: float, theta: float, *, fragment: int | None = None
               ) -> float | None:
        """The share of the time since start-up in which the global model advanced
        (uptime_from_marks; a merge of any fragment advances it, or of `fragment` alone
        with it), with `theta` noted as in force at `now` (note_theta); None while the
        run is in start-up."""
        self.note_theta(now, theta)
        marks = self.fragment_marks()
        if fragment is not None:
            marks = [marks[fragment]]
        if self.first_merge is None:
            return None
        return uptime_from_marks(marks, self.startup_seconds(now), self.clock.wall_seconds(now),
                                 theta, self.thetas)

    def fragment_marks(self) -> list[list[float]]:
        """Per fragment, the distinct times its merges still standing were published,
        as seconds of wall time since the start; a merge of no named fragment (a whole
        model's) is a mark of every fragment."""
        return [sorted({self.clock.active(e.time) for e in self.entries
                        if e.fragment in (None, p)}) for p in range(self.fragments)]

    def max_stall(self, now: float, *, fragment: int | None = None) -> float:
        """The longest gap between successive merges, the open one up to `now` included."""
        wall = self.clock.wall_seconds(now)
        marks = [0.0, *(m for m in self.merge_marks(fragment=fragment) if m <= wall), wall]
        return max(b - a for a, b in itertools.pairwise(marks))

    def merge_marks(self, *, fragment: int | None = None) -> list[float]:
        """The distinct merge times still standing, as seconds of wall time since the start."""
        return sorted({self.clock.active(e.time) for e in self.entries
                       if fragment in (None, e.fragment)})

    def median_merge_gap(self, *, fragment: int | None = None) -> float | None:
        """The median gap between successive merges; a fault-free run's gives theta."""
        gaps = [b - a for a, b in itertools.pairwise(self.merge_marks(fragment=fragment))]
        return statistics.median(gaps) if gaps else None

    def snapshot(self, now: float, theta: float | None = None) -> dict:
        """Every figure at `now`, per run and per island (`overcredited`: the islands
        credited above their allocation, a bug shown); uptime is None without `theta`."""
        islands, lost = {}, dict.fromkeys(LOST_CAUSES, 0.0)
        over = self.overcredited(now)
        for name, state in self.islands.items():
            allocated, useful = self.allocated_seconds(name, now), self.useful_seconds(name, now)
            island_lost = dict(state.lost)  # and the merged steps rollback took back:
            island_lost["rollback"] += self._value(name, state.rolled_back_steps) or 0.0
            for cause, seconds in island_lost.items():
                lost[cause] += seconds
            islands[name] = {
                "allocated_s": allocated, "useful_s": useful,
                "goodput": None if useful is None or allocated == 0 else useful / allocated,
                "useful_steps": state.useful_steps, "step_time_s": self.step_time(name),
                "rolled_back_steps": state.rolled_back_steps, "lost_s": island_lost,
                "in_run": state.windows[-1][1] is None and self.clock.end is None,
                "overcredited": name in over,
            }
        useful = _total([i["useful_s"] for i in islands.values()])
        allocated = sum(i["allocated_s"] for i in islands.values())
        return {
            "time": now, "wall_s": self.clock.wall_seconds(now), "paused": self.clock.paused,
            "allocated_s": allocated, "useful_s": useful,
            "goodput": None if useful is None or allocated == 0 else useful / allocated,
            "lost_s": lost, "unattributed_s": None if useful is None
            else allocated - useful - sum(lost.values()),
            "overcredited": over,
            "merges": len(self.entries), "merge_events": len(self.merge_marks()),
            "startup_s": self.startup_seconds(now),
            "islands": islands, "theta_s": theta,
            "uptime": None if theta is None else self.uptime(now, theta),
            "max_stall_s": self.max_stall(now), "median_merge_gap_s": self.median_merge_gap(),
        }

    def _island(self, island: str) -> _Island:
        if island not in self.islands:
            known = ", ".join(map(repr, self.islands)) or "none"
            raise ValueError(f"unknown island {island!r}; the run's islands: {known}")
        return self.islands[island]

    def _value(self, island: str, steps: int) -> float | None:
        step_time = self.step_time(island) if steps else 0.0
        return None if step_time is None else steps * step_time

