"""Elastic's whole-job restarts, as an island follows them.

In elastic mode syncd restarts the whole job when an island is lost (RunControl.
restart_job): every island pauses until the restart's end, takes the rolled-back
global model whole, and starts a fresh outer step at the same step (mod H) as
the others, or islands would wait at the barriers of different fragments for
each other for ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from diloco.island import Island
from trainer.link import POLL_S


class RestartStore(Protocol):
    """What the restarts need of a syncd.store.RunStore (its `control`)."""

    def restart(self) -> tuple[int, float]: ...


class WholeJobRestarts:
    """The restarts one island has followed.

    Args:
        store: where syncd announces restarts.
        inner_steps: the run's H.
    """

    def __init__(self, store: RestartStore, inner_steps: int):
        self.store = store
        self.inner_steps = inner_steps
        self.seen = store.restart()[0]

    def pending(self) -> bool:
        """Whether syncd announced a restart this island has not followed yet."""
        return self.store.restart()[0] > self.seen

    def take(self) -> float | None:
        """The end of a restart not followed yet (now followed), or None."""
        restarts, until = self.store.restart()
        if restarts <= self.seen:
            return None
        self.seen = restarts
        return until

    def until(self) -> float:
        """The end of the run's last restart (in the past when none is under way)."""
        return self.store.restart()[1]

    def join(self, island: Island, until: float, beat: Callable[[], None],
             stopping: Callable[[], bool]) -> None:
        """Begin a fresh outer step (the island's step, the seq of its updates, rounded
        up to a multiple of H) at the end of the restart under way (`until`), if any,
        like the other islands."""
        h = self.inner_steps
        island.move_to(-(-island.step // h) * h, island.tokens)
        while time.time() < until and not stopping():
            beat()
            time.sleep(POLL_S)
