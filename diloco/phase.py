"""An island's phase: at which of its own inner steps it sends each fragment.

Fragment p is due after inner step t when (t - offset) mod H == floor(H*(p+1)/P) mod H
(diloco/fragments.py), offset 0 to begin with. Islands start at different times and
rejoin after faults, so their sends of one fragment are apart by up to a period, and
stay so: an island with tau >= 1 never waits. A round of sync.merge_each_period waits
for the island latest in phase; the earlier ones train on meanwhile and mix the merged
fragment in their lead plus the round trip after their send, every step of it kept on
top of a global that lacks it (diloco/island.py, mix_global).

So an island keeps the phase of the others. A merge tells each island in it that
trains at the pace of the round's latest (`in_pace`) how long its update waited for
that latest arrival: its lead (Synchronizer.merge's `leads`). An island whose lead is
at least MIN_SHIFT_STEPS of its own steps puts every send off by that many steps,
once: its next update of each fragment carries H + shift steps (the merge weighs it
by its tokens) and arrives with the latest island's, and syncd expects it then. A
lead reported for a send made before the shift is of the old phase and is not
followed. An island that waits for each merge (tau 0, mode sync, elastic's barrier)
is brought into phase by its waits and keeps offset 0.

Pure: the caller passes each inner step's time, on its own clock.
"""

from __future__ import annotations

from diloco.config import SyncConfig
from diloco.fragments import due_fragments

# A lead shorter than this many of the island's steps is noise of the step times.
MIN_SHIFT_STEPS = 2
PACE_WEIGHT = 0.2  # of the newest step in the island's mean seconds per step


class Phase:
    """When an island sends each fragment, shifted to the others' phase.

    Args:
        inner_steps: H.
        fragments: P.
        follow: whether the island follows the leads merges report (it does not wait
            for each merge: tau >= 1, not elastic); without, the schedule stays at
            offset 0.
    """

    def __init__(self, inner_steps: int, fragments: int, follow: bool):
        if inner_steps < 1 or fragments < 1:
            raise ValueError(f"inner_steps and fragments must be at least 1, got "
                             f"{inner_steps} and {fragments}")
        self.inner_steps = inner_steps
        self.fragments = fragments
        self.follow = follow
        self.offset = 0
        self.since = 0  # sends from this inner step on are in the current phase
        self.step_s: float | None = None  # the island's mean seconds per inner step
        self._last: tuple[int, float] | None = None
        self._sent: dict[int, int] = {}  # fragment -> the inner step of its last send

    @classmethod
    def of(cls, sync: SyncConfig, barrier: bool = False) -> Phase:
        """An island's phase under these settings; `barrier`: its mode waits at each merge
        (elastic). It follows leads with tau >= 1 only: with tau 0 the island waits."""
        return cls(sync.inner_steps, sync.fragments, sync.overlap_steps > 0 and not barrier)

    def due(self, step: int) -> list[int]:
        """The fragments due after inner step `step`, which the island sends then. One
        sent fewer than H steps before (a shift moved its due step past its last send)
        waits for its next: each fragment's window is H steps, or H + the shift."""
        shifted = step - self.offset
        due = [p for p in (due_fragments(shifted, self.inner_steps, self.fragments)
                           if shifted >= 1 else [])
               if step - self._sent.get(p, step - self.inner_steps) >= self.inner_steps]
        self._sent.update(dict.fromkeys(due, step))
        return due

    def stepped(self, step: int, now: float) -> None:
        """Inner step `step` ended at `now`: the island's pace, waits included, which
        turns a lead in seconds into its steps."""
        if self._last is not None and step > self._last[0] and now >= self._last[1]:
            seconds = (now - self._last[1]) / (step - self._last[0])
            self.step_s = seconds if self.step_s is None else (
                (1 - PACE_WEIGHT) * self.step_s + PACE_WEIGHT * seconds)
        self._last = (step, now)

    def shift_for(self, lead_s: float) -> int:
        """The steps a lead of `lead_s` seconds puts the island's sends off by: 0 below
        MIN_SHIFT_STEPS, at most H - 1 (a whole period more is the same phase)."""
        if not self.step_s or lead_s <= 0:
            return 0
        steps = min(round(lead_s / self.step_s), self.inner_steps - 1)
        return steps if steps >= MIN_SHIFT_STEPS else 0

    def lead(self, seq: int, lead_s: float, step: int) -> int:
        """The island's update sent after inner step `seq` waited `lead_s` seconds in its
        round for the round's latest arrival; told at inner step `step`, before that
        step's sends. Returns the steps the sends are put off by (0: none)."""
        if not self.follow or seq < self.since:
            return 0
        shift = self.shift_for(lead_s)
        if shift:
            self.offset += shift
            self.since = step
        return shift


def in_pace(step_s: float | None, latest_step_s: float | None, inner_steps: int) -> bool:
    """Whether an island of `step_s` seconds per inner step keeps the pace of its round's
    latest island (`latest_step_s`): over a period of H steps the two drift apart by at
    most one step; unknown: not. Only then is its lead a phase. A faster island's lead
    comes back each period, and following it would only make its windows longer: in
    process, islands at speeds 0.50 to 0.38 that followed read 1.02x the held-out loss
    at equal tokens of the same islands that did not (docs/journal/benchmarks-2026.md).
    """
    if not step_s or not latest_step_s:
        return False
    return inner_steps * abs(step_s - latest_step_s) <= latest_step_s
