"""Warm standby islands: the bookkeeping of a host's pool, and what makes a claim good.

Pure: plain values and times passed in; no processes, Redis or clock. The pool
manager (trainer/pool_manager.py) carries it out with real processes.

A standby is an island process made ready before anyone needs it: the
interpreter is up, torch and the project's modules are imported, and the corpus
(and a model) of the last run the host served are open. A start or a rejoin
claims one; the claimed standby then reads the run spec, builds the model (or
reuses its own, when the shape is the run's), pulls the newest globals and its
data cursor, and trains. The pool refills one standby at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diloco.config_parse import config_from_spec
from diloco.data import CORPUS_FIELDS
from diloco.sizes import STANDBY_BASE_BYTES, estimate

LAUNCHING, READY = "launching", "ready"
CLAIM_FIELDS = ("run", "island", "epoch")


@dataclass
class Standby:
    """One standby process of the pool."""

    pid: int
    launched_at: float
    state: str = LAUNCHING
    ready_at: float | None = None
    warm_for: dict[str, Any] = field(default_factory=dict)  # {"data": ..., "model": ...}


class Pool:
    """The standbys of one host, by pid.

    Args:
        size: how many ready standbys the host keeps (0: no pool, every start is cold).
    """

    def __init__(self, size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"pool size must be a whole number of 0 or more, got {size!r}")
        self.size = size
        self.standbys: dict[int, Standby] = {}
        self.claimed = 0  # standbys handed to islands so far
        self.exited_unclaimed = 0

    def launched(self, pid: int, now: float, warm_for: dict[str, Any] | None = None) -> Standby:
        """A standby process was started at `now`; it is not ready yet."""
        if pid in self.standbys:
            raise ValueError(f"standby {pid} is already in the pool")
        standby = Standby(pid, now, warm_for=dict(warm_for or {}))
        self.standbys[pid] = standby
        return standby

    def ready(self, pid: int, now: float) -> None:
        """Standby `pid` said it is ready (ignored if it has gone meanwhile)."""
        standby = self.standbys.get(pid)
        if standby is not None and standby.state == LAUNCHING:
            standby.state, standby.ready_at = READY, now

    def exited(self, pid: int) -> Standby | None:
        """An unclaimed standby ended (it crashed, or was killed); it leaves the pool."""
        standby = self.standbys.pop(pid, None)
        if standby is not None:
            self.exited_unclaimed += 1
        return standby

    def claim(self) -> Standby | None:
        """Hand out the standby ready the longest (it leaves the pool); None when no
        standby is ready: the caller starts the island cold."""
        ready = [s for s in self.standbys.values() if s.state == READY]
        if not ready:
            return None
        standby = min(ready, key=lambda s: (s.ready_at, s.pid))
        del self.standbys[standby.pid]
        self.claimed += 1
        return standby

    def surplus(self) -> list[int]:
        """The standbys beyond `size` (the size went down), to be ended: those still
        launching first, then the youngest ready. They leave the pool at once, so that
        no claim takes one."""
        extra = len(self.standbys) - self.size
        if extra <= 0:
            return []
        order = sorted(self.standbys.values(),
                       key=lambda s: (s.state == READY, -(s.ready_at or s.launched_at)))
        pids = [s.pid for s in order[:extra]]
        for pid in pids:
            del self.standbys[pid]
        return pids

    def needs_refill(self) -> bool:
        """Whether to start one more standby now: fewer than `size` in the pool, and no
        other refill under way (one at a time, so refills never crowd the host)."""
        launching = any(s.state == LAUNCHING for s in self.standbys.values())
        return not launching and len(self.standbys) < self.size

    def counts(self) -> dict[str, int]:
        states = [s.state for s in self.standbys.values()]
        return {"size": self.size, "ready": states.count(READY),
                "launching": states.count(LAUNCHING), "claimed": self.claimed,
                "exited_unclaimed": self.exited_unclaimed}


def check_claim(claim: Any, active: bool, current_epoch: int | None) -> str | None:
    """Why a claim must be refused, or None when a standby may take it.

    Args:
        claim: the claim as decoded JSON: {"run", "island", "epoch", ...}.
        active: whether the claim's run is active (in arch:runs) and not stopping.
        current_epoch: the island's current epoch in the run (None: it has none).
    """
    if not isinstance(claim, dict) or any(k not in claim for k in CLAIM_FIELDS):
        fields = sorted(claim) if isinstance(claim, dict) else claim
        return f"a claim names {', '.join(CLAIM_FIELDS)}, got {fields!r}"
    epoch = claim["epoch"]
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        return f"a claim's epoch is a whole number, got {epoch!r}"
    if not active:
        return f"run {claim['run']} is not active (stopped, stopping or ended)"
    if current_epoch is None:
        return f"run {claim['run']} has no island {claim['island']!r}"
    if epoch < current_epoch:
        return (f"stale claim: epoch {epoch} of island {claim['island']!r}, which is at "
                f"epoch {current_epoch} now")
    if epoch > current_epoch:
        return (f"claim for epoch {epoch} of island {claim['island']!r}, which is only at "
                f"epoch {current_epoch}")
    return None


def warm_for(spec: dict[str, Any]) -> dict[str, Any]:
    """What a standby prepares for runs like this one: its corpus, tokenized as the run
    tokenizes it, and its model's shape (whose vocabulary is the tokenizer's)."""
    config = spec.get("config", {})
    data = config.get("data", {})
    model = config.get("model", {})
    return {"data": {k: data[k] for k in CORPUS_FIELDS if k in data},
            "model": {k: model[k] for k in ("source", "hf_config", "n_layer", "n_embd",
                                            "n_head", "block_size") if k in model}}


def wanted_size(specs: dict[str, dict[str, Any]], region: str, memory_bytes: int,
                serving: Mapping[str, int]) -> tuple[int, dict[str, Any]]:
    """How many standbys a host of `region` keeps by default, and what they prepare.

    Per active run (`specs`, by run id), its islands of one process in the region
    that this host does not already run (`serving`, by run id), plus one: the largest
    of these (one with no run there), within the host's memory. Before a start that is
    every island of the run and one more, for the first rejoin; once the run's islands
    train here, one: the islands that took standbys count as filled slots, so that
    a run that trains does not pay for refilling what it claimed (a refill's imports
    and model take the cores the islands train on). The islands served count at that
    run's estimate of an island (diloco/sizes.py), each standby at STANDBY_BASE_BYTES
    and a model. The standbys prepare the largest run's corpus and model shape
    (`warm_for`); {} with no run there.
    """
    largest, islands, wanted = None, 0, 0
    for run_id, spec in specs.items():
        count = sum(1 for i in spec.get("config", {}).get("islands", [])
                    if i.get("region") == region and i.get("processes", 1) == 1)
        if count > islands:
            largest, islands = spec, count
        wanted = max(wanted, count - serving.get(run_id, 0))
    if largest is None:
        return (1 if memory_bytes >= STANDBY_BASE_BYTES else 0), {}
    sized = estimate(config_from_spec(largest))
    island = max(need.total for need in sized.islands.values())
    running = sum(serving.values())
    fits = (memory_bytes - running * island) // (STANDBY_BASE_BYTES + sized.model_bytes)
    return max(0, min(wanted + 1, fits)), warm_for(largest)
