"""syncd's choice of a run's tau: whether its islands wait for each merge.

The choice is the run's (diloco/overlap.py says why): syncd measures the run's pace,
the tokens its islands trained per second from their heartbeats, each way, and
writes the tau it chooses to arch:R:tau, which each island's tend thread reads
(trainer/tending.py) and its loop uses from its next send. Only a decoupled run
with sync.overlap_steps >= 1 and sync.wait_share > 0 chooses; the others keep their
config's tau and write nothing. Each island's pace is its tokens over its own clock
(its heartbeats' time), so a heartbeat read late moves nothing, and tokens that fell
(a restart) count as none.
"""

from __future__ import annotations

import logging

from diloco.overlap import Overlap, window_seconds
from syncd.records import Heartbeat
from syncd.spec import RunSpec
from syncd.store import RunStore

log = logging.getLogger("archipelago.syncd")


class RunWaiting:
    """A run's tau, chosen from its pace and written for its islands.

    Args:
        store: the run's Redis keys.
        spec: the run's spec.
    """

    def __init__(self, store: RunStore, spec: RunSpec):
        s = spec.config.sync
        self.store = store
        self.overlap = Overlap(s.overlap_steps,
                               s.wait_share if spec.initial["mode"] == "decoupled" else 0.0)
        self.islands = {island.name for island in spec.config.islands}
        self.started = False  # whether every island has trained: only then is a pace measured
        self.written: int | None = None

    def tau(self) -> int:
        """The tau the islands use now: the one written, the config's before."""
        return self.overlap.tau if self.written is None else self.written

    def waits(self) -> bool:
        """Whether syncd chose tau 0, so the run's rounds wait for every island sending
        (Synchronizer.decide `waiting`); a config's tau 0 keeps its quorum and grace."""
        return self.overlap.waits()

    def observe(self, now: float, heartbeats: dict[str, Heartbeat], step_s: float | None,
                send_steps: float) -> None:
        """The islands' last heartbeats at `now`, the median island step time (None before
        one is known: nothing is measured) and the inner steps between two sends of an
        island (H / P): tau chosen, and written if it changed. Nothing is measured before
        every island of the run has trained (its heartbeat past "starting"): a window
        while some start reads their start-up, not the mode."""
        self.started = self.started or all(
            island in heartbeats and heartbeats[island].state != "starting"
            for island in self.islands)
        if not self.overlap.adaptive or step_s is None or not self.started:
            return
        marks = {island: (beat.time, beat.tokens) for island, beat in heartbeats.items()}
        tau = self.overlap.observe(now, marks, window_seconds(send_steps * step_s))
        if tau != self.written:
            self.store.control.set_tau(tau)
            self.written = tau
            log.info("run %s: islands use tau %d from now (waiting slows the pace by %s)",
                     self.store.run_id, tau, self.overlap.slowdown())
