"""What an island acts out of its active fault, and its emulated wide-area link.

Faults other than kill and stop reach an island through the run's store
(IslandSignals.fault: {kind, until, factor}): straggle multiplies its step time,
partition holds its sends, heartbeats and pulls (both directions: Link, Downloads
and the runner's whole pulls wait), degrade divides its bandwidth, corrupt
poisons its next update with NaN. The link's time for a message is latency +
bytes * bytes_scale * 8 / bandwidth, on the island's configured link, with the run's
emulation.link process; with none it is 0, the network between the hosts taking what
it takes (a degrade fault, which acts on the emulated link, then does nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from diloco.config import EmulationConfig, IslandConfig
from diloco.wan import transfer_time
from trainer.link import POLL_S

# The fault as last read is used for up to FAULT_READ_S; the island's tend thread
# (trainer/tending.py) reads it every quarter second, so that its training loop never
# waits for the read. Only a tend thread stalled that long (not a read held up behind
# a full link's bytes, which the loop would wait behind as well) has the loop read it.
FAULT_READ_S = 5.0


class FaultStore(Protocol):
    """What the emulation needs of a syncd.store.RunStore (its `signals`)."""

    def fault(self, island: str) -> dict[str, Any]: ...

    def clear_fault(self, island: str) -> None: ...


class FaultEmulation:
    """One island's faults and link, as the island process acts them out.

    Args:
        store: where the island's active fault is read.
        name: the island's name.
        island_config: its speed, bandwidth and latency.
        emulation: the run's emulation section: its link (process or none) and its
            bytes_scale (a message counts this many times).
        stopping: whether the island is stopping (a partition's wait ends then).
    """

    def __init__(self, store: FaultStore, name: str, island_config: IslandConfig,
                 emulation: EmulationConfig, stopping: Callable[[], bool]):
        self.store = store
        self.name = name
        self.island_config = island_config
        self.emulation = emulation
        self.stopping = stopping
        self._fault: dict[str, Any] = {}
        self._fault_read = 0.0

    def fault(self) -> dict[str, Any]:
        """The active fault ({kind, until, factor}), {} if none: as last read, read
        again first if that was FAULT_READ_S ago or more."""
        if time.time() - self._fault_read > FAULT_READ_S:
            self.read()
        return self._fault

    def read(self) -> None:
        """Read the active fault from the store now."""
        self._fault = self.store.fault(self.name)
        self._fault_read = time.time()

    def partitioned(self) -> bool:
        """Whether the island's link is cut now (no sends, heartbeats or pulls)."""
        return self.fault().get("kind") == "partition"

    def transfer_time(self, nbytes: int) -> float:
        """Seconds the island holds a message of `nbytes` for its link now: the emulated
        link's time, 0 with emulation.link none."""
        if self.emulation.link == "none":
            return 0.0
        bandwidth = self.island_config.bandwidth_gbps
        if self.fault().get("kind") == "degrade":
            bandwidth /= max(float(self.fault().get("factor", 10.0)), 1.0)
        return transfer_time(nbytes, bandwidth, self.island_config.latency_ms,
                             self.emulation.bytes_scale)

    def wait_while_partitioned(self) -> None:
        while self.partitioned() and not self.stopping():
            time.sleep(POLL_S)

    def slowdown(self) -> float:
        """How many times slower than its compute a step takes: the island's speed and
        a straggle fault."""
        slow = 1.0 / self.island_config.speed
        if self.fault().get("kind") == "straggle":
            slow *= max(float(self.fault().get("factor", 4.0)), 1.0)
        return slow

    def corrupt(self, payload: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The update's payload, poisoned with NaN once if a corrupt fault is active."""
        if self.fault().get("kind") != "corrupt":
            return payload
        self.store.clear_fault(self.name)
        self._fault = {}
        return {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                for k, v in payload.items()}
