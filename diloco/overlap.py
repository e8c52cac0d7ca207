"""How many steps a run's islands train past a send before they mix the merge in: tau,
from the pace measured either way.

tau >= 1 overlaps the turnaround of an update (its upload, the round, the download)
with training: an island never waits for it, but mixes the merged fragment in with
its own steps since the send kept on top, which the merge lacks. tau = 0 waits for
the merge of its own update, synchronous DiLoCo's semantics, at the cost of the wait.
bench convergence measured both ends (docs/ARCHITECTURE.md "Mixing"): 4 islands on 2
cores at 0.25 s steps, tau 0 merged 1.5% fewer tokens than tau 1 and its loss at
equal tokens was 4% lower; at 30 ms steps waiting halved the tokens.

What a wait costs is not its turnaround alone: where islands share cores one's wait
is another's compute, and a wait is short only when every island waits, in one phase
(one island waiting for a round of islands that do not wait waits for the slowest).
So the choice is the run's, made by syncd, and measured on the run's **pace**, the
tokens its islands train per second (each island's tokens over its own clock, from
its heartbeats, summed): the run overlaps for a window (its start-up settles, with the
config's tau, the one its islands use before syncd chose), waits for a window, and from
then on waits while its pace waiting is at least its pace overlapping over
(1 + wait_share), each the mean of its last PACES windows. A window's pace reads a few
percent either way from one to the next where islands share cores, so the mode in use
is left only on a clear reading: waiting when the slowdown exceeds the share by half of
it, overlapping when it is under the share by half of it. A window's first half lets
the islands settle into its mode; its second half is measured. A mode is chosen only
on paces measured one after the other, as the load on shared cores drifts: the other
mode is measured again (a probe of PACES windows, one where its first reads it worse
by more than twice the share) REPROBE windows after a choice,
twice as long after each probe that changed nothing (at most BACKOFF times REPROBE)
and REPROBE after one that did, and at once when the mode in use measures slower than
the other did when it was last measured. Pure: the caller passes the times and the
tokens in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from statistics import fmean

WAIT, OVERLAP = "wait", "overlap"
OTHER = {WAIT: OVERLAP, OVERLAP: WAIT}
WINDOW_SENDS = 16  # a window: this many of an island's sends
MIN_WINDOW_S = 2.0  # and at least this long
PACES = 2  # windows of a mode whose mean pace counts
REPROBE = 8  # windows from a decision to the next probe of the mode not in use
BACKOFF = 16  # at most this many times REPROBE windows between two probes
MARGIN = 0.5  # the mode in use is left only past the share by this much of it


Marks = Mapping[str, tuple[float, int]]  # island -> (its time, its tokens then)


def pace(before: Marks, after: Marks) -> float:
    """The islands' tokens per second from `before` to `after`: each island's tokens
    over its own clock, summed over those in both whose clock moved; tokens that fell
    (a restart) count as none."""
    total = 0.0
    for island, (then, tokens) in after.items():
        if island in before and then > before[island][0]:
            total += max(0, tokens - before[island][1]) / (then - before[island][0])
    return total


def window_seconds(send_interval_s: float) -> float:
    """A window's length: WINDOW_SENDS of an island's sends (its seconds from one send
    to the next), at least MIN_WINDOW_S."""
    return max(MIN_WINDOW_S, WINDOW_SENDS * send_interval_s)


class Overlap:
    """A run's tau, from its pace waiting and overlapping.

    Args:
        tau: the config's sync.overlap_steps (0: always wait for the merge).
        wait_share: the config's sync.wait_share: wait while waiting slows the run's
            pace by at most this share; 0: always overlap tau steps.
        reprobe: windows from a decision to the first probe of the mode not in use.
    """

    def __init__(self, tau: int, wait_share: float, reprobe: int = REPROBE):
        if tau < 0:
            raise ValueError(f"tau must be at least 0, got {tau}")
        if not 0.0 <= wait_share <= 1.0:
            raise ValueError(f"wait_share must be within 0 and 1, got {wait_share}")
        if reprobe < 1:
            raise ValueError(f"reprobe must be at least 1, got {reprobe}")
        self.tau = tau
        self.wait_share = wait_share
        self.reprobe = reprobe
        self.adaptive = tau > 0 and wait_share > 0
        self.mode = WAIT if tau == 0 else OVERLAP
        # mode -> tokens per second of its last PACES windows
        self.paces: dict[str, deque[float]] = {m: deque(maxlen=PACES) for m in OTHER}
        self._ends: float | None = None  # when the window going on ends
        self._halfway: float | None = None  # when its measured half begins
        self._marks: Marks | None = None  # each island's (time, tokens) as that half began
        self._probed_from: str | None = None  # the mode in use before the probe going on
        self._probe_left = 0  # windows the probe going on lasts after this one
        self._decided = False  # whether the first choice was made
        self._every = reprobe  # windows between two probes, doubled while they change nothing
        self._until_probe = reprobe

    def steps(self) -> int:
        """tau now: 0 while the run waits for each merge, the config's tau otherwise."""
        return 0 if self.mode == WAIT else self.tau

    def observe(self, now: float, marks: Marks, window_s: float) -> int:
        """At `now` (the caller's clock), each island had trained so many tokens at a
        time of its own (`marks`: island -> (its time, its tokens), from its last
        heartbeat); a window lasts `window_s` (`window_seconds`): tau from now."""
        if not self.adaptive:
            return self.steps()
        if self._ends is None:
            self._begin(now, window_s)
        if self._marks is None and now >= self._halfway:
            self._marks = dict(marks)
        elif self._marks is not None and now >= self._ends:
            self.paces[self.mode].append(pace(self._marks, marks))
            self.mode = self._next_mode()
            self._begin(now, window_s)
        return self.steps()

    def _begin(self, now: float, window_s: float) -> None:
        self._ends, self._halfway, self._marks = now + window_s, now + window_s / 2, None

    def _next_mode(self) -> str:
        for mode in (OVERLAP, WAIT):  # first each mode's pace is measured, one after the other
            if not self.paces[mode]:
                return mode
        if self._probe_left > 0:  # a probe lasts PACES windows: its mean is all new,
            self._probe_left -= 1  # but one that reads the probed mode far worse ends
            if not self._far_worse(self.mode):
                return self.mode
            self._probe_left = 0  # its older windows are not its pace now: dropped
            self.paces[self.mode] = deque([self.paces[self.mode][-1]], maxlen=PACES)
        if not self._decided:  # the first two windows, one after the other
            self._decided = True
            return self.best()
        best = self.best(keep=self._probed_from or self.mode)
        if self._probed_from is not None:  # a probe just ended: both paces are fresh
            same = best == self._probed_from
            self._every = min(self._every * 2, BACKOFF * self.reprobe) if same else self.reprobe
            self._until_probe = self._every
            self._probed_from = None
            return best
        self._until_probe -= 1
        if best == self.mode and self._until_probe > 0:
            return self.mode
        # A probe is due, or the mode in use measured slower than the other did when it
        # was last measured: the load may have moved since, so the other is measured now.
        self._probed_from = self.mode
        self._probe_left = PACES - 1
        return OTHER[self.mode]

    def _far_worse(self, mode: str) -> bool:
        """Whether `mode`'s last window reads its pace worse than the other's mean by
        more than twice the share (a probe needs no second window to say so)."""
        last, other = self.paces[mode][-1], fmean(self.paces[OTHER[mode]])
        wait, overlap = (last, other) if mode == WAIT else (other, last)
        if wait <= 0:
            return mode == WAIT
        slowdown = overlap / wait - 1.0
        return slowdown > 2 * self.wait_share if mode == WAIT else slowdown < -2 * self.wait_share

    def waits(self) -> bool:
        """Whether the run chose to wait now (tau 0 where the config's is not)."""
        return self.adaptive and self.mode == WAIT

    def slowdown(self) -> float | None:
        """How much waiting slows the run's pace: the pace overlapping over the pace
        waiting, less 1; None until both are measured."""
        if not self.paces[WAIT] or not self.paces[OVERLAP]:
            return None
        wait, overlap = fmean(self.paces[WAIT]), fmean(self.paces[OVERLAP])
        return overlap / wait - 1.0 if wait > 0 else float("inf")

    def best(self, keep: str | None = None) -> str:
        """WAIT while waiting slows the run's pace by at most wait_share (or before both
        are measured), OVERLAP otherwise; with the mode in use (`keep`), that mode unless
        the slowdown is past the share by MARGIN of it."""
        slowdown = self.slowdown()
        if slowdown is None:
            return WAIT
        margin = {None: 0.0, WAIT: MARGIN, OVERLAP: -MARGIN}[keep] * self.wait_share
        return WAIT if slowdown <= self.wait_share + margin else OVERLAP
