"""The island's tend thread: the training loop's reads and writes of Redis, off it.

The training loop waits for no round trip to Redis while it trains: over a wide-area
link each costs the link's latency, behind whatever the link carries (on the
many-hosts harness they were a third of a kernel-shaped island's wall time). What it
asks often (whether the run is done, the tau syncd chose, its fault, syncd's lease
holder and what syncd handled of its kept updates) is read, and what it writes often
(its data cursor, its heartbeat) written, by a thread of the island's every TEND_S
(`Tending.tend`); the loop reads for itself only what that thread has not read for
STALE_S (it is stalled: a read held up behind a full link's bytes is not, and the
loop would wait behind them as well). The island tends once before its loop begins.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable

import redis

from diloco.island import Island
from syncd.store import RunStore
from trainer.emulation import FAULT_READ_S, FaultEmulation
from trainer.link import HEARTBEAT_S
from trainer.sending import Sending

log = logging.getLogger("archipelago.island")
# As often as the island heartbeats, and as it read its fault and the run's end before:
# the tend thread asks Redis no more often than the loop did.
TEND_S = HEARTBEAT_S
STALE_S = FAULT_READ_S


class Tending:
    """What the tend thread keeps for one island's loop.

    Args:
        store: the run's Redis keys.
        name: the island's name in the run config.
        emulation: the island's faults (read here).
        sending: the island's sending (its lease holder and handled seqs read here).
        beat: writes the island's heartbeat if one is due.
    """

    def __init__(self, store: RunStore, name: str, emulation: FaultEmulation,
                 sending: Sending, beat: Callable[[], None]):
        self.store = store
        self.name = name
        self.emulation = emulation
        self.sending = sending
        self.beat = beat
        self._done = False
        self._done_read = 0.0
        self.chosen: int | None = None  # syncd's choice for the run, as last read
        self.used: int | None = None  # the tau the island's loop last used
        self._cursor: dict | None = None  # the cursor of the last send, until written
        self._failing = False

    def done(self) -> bool:
        """Whether syncd marked the run done, as last read."""
        if time.time() - self._done_read > STALE_S:
            self.read_done()
        return self._done

    def tau(self, configured: int) -> int:
        """The tau the island uses now, for its next send: syncd's choice for the run as
        last read (syncd/waiting.py), or the config's until syncd chose; each change is
        logged."""
        tau = configured if self.chosen is None else self.chosen
        if tau != self.used:
            log.info("island %s: tau %d from now", self.name, tau)
            self.used = tau
        return tau

    def read_done(self) -> None:
        self._done = self.store.control.done()
        self._done_read = time.time()

    def keep_cursor(self, island: Island) -> None:
        """The island's data cursor now (after a send), to be written."""
        rng = base64.b64encode(island.sampler.state().numpy().tobytes()).decode()
        self._cursor = {"step": island.step, "tokens": island.tokens, "rng": rng}

    def write_cursor(self) -> None:
        """Write the cursor the last send kept, if it is not written yet: a later epoch
        (a rejoin) goes on from there in the island's shard."""
        cursor = self._cursor
        if cursor is not None:
            self.store.signals.save_cursor(self.name, cursor)
            if self._cursor is cursor:  # not a newer one, kept meanwhile
                self._cursor = None

    def tend(self) -> None:
        """Every TEND_S, on the tend thread: read what the loop asks of the run, write
        its cursor and beat. Redis out of reach (a cut link) is logged once, and tried
        again on the next call."""
        try:
            self.read_done()
            self.chosen = self.store.control.tau()
            self.emulation.read()
            self.sending.read()
            self.write_cursor()
            self.beat()
        except (redis.RedisError, OSError) as exc:
            if not self._failing:
                log.warning("island %s: Redis out of reach (%s); trying again", self.name, exc)
            self._failing = True
            return
        self._failing = False
