"""An island's start-up, phase by phase: where the seconds from a start or a rejoin
to the first inner step go.

Pure: marks are plain times (time.time() seconds, from any process of the host)
and nothing here reads a clock. A phase runs from one mark to the next:

    dispatch    asked (the start or rejoin the web app or the chaos driver asked
                for) -> launched (the supervisor started the process, or a warm
                standby was claimed)
    process     launched -> started (the interpreter is exec'd)
    imports     started -> imported (the interpreter is up and torch and the
                project's modules are imported: the runner's main begins)
    spec        imported -> spec (the run's spec is read and checked, version 0 is
                published)
    data        spec -> data (the corpus is open)
    model       data -> model (the model, its optimizer and data shard are built)
    pull        model -> pull (the newest globals and the data cursor are in; the
                first step's gradients and moments faulted in beside the reads)
    first_step  pull -> first_step (the first inner step is done)

Beside the phases the island reports its first step's CPU seconds on the training
thread (`first_step_cpu_s`, in syncd's rejoin event): the first step's wall time less
that is time spent waiting for a core.

A warm standby did process and imports (and often data and model) before its
claim: for it `launched`, `started` and `imported` are the claim, so those
phases are 0 and its start-up counts from the claim, not from its launch.
"""

from __future__ import annotations

import itertools

MARKS = ("asked", "launched", "started", "imported", "spec", "data", "model", "pull",
         "first_step")
PHASES = ("dispatch", "process", "imports", "spec", "data", "model", "pull", "first_step")


class StartClock:
    """The marks of one epoch's start-up, as they happen.

    Args:
        marks: marks already known (from the supervisor's environment); each a name
            in MARKS and a time in seconds.
    """

    def __init__(self, marks: dict[str, float | None] | None = None):
        self.marks: dict[str, float] = {}
        for name, at in (marks or {}).items():
            if at is not None:
                self.mark(name, at)

    def mark(self, name: str, at: float) -> None:
        """Phase `name`'s end (MARKS) happened at `at`."""
        if name not in MARKS:
            raise ValueError(f"mark must be one of {', '.join(MARKS)}, got {name!r}")
        self.marks[name] = float(at)

    def breakdown(self) -> dict[str, float]:
        """Seconds per phase whose two ends are marked (never below 0: marks come from
        several processes' clocks), in start-up order; a phase that lacks an end is
        left out rather than guessed."""
        out = {}
        for phase, (start, end) in zip(PHASES, itertools.pairwise(MARKS), strict=True):
            if start in self.marks and end in self.marks:
                out[phase] = round(max(self.marks[end] - self.marks[start], 0.0), 3)
        return out

    def since(self, start: str, end: str = "first_step") -> float | None:
        """Seconds from mark `start` to mark `end`; None while either is missing."""
        if start not in self.marks or end not in self.marks:
            return None
        return max(self.marks[end] - self.marks[start], 0.0)
