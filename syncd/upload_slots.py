"""Upload slots: a bound on the update messages of a run on the data plane at once,
whatever the number of islands.

Before an island writes an update message, it puts a ticket naming the update
(island, epoch, fragment, seq) at the end of the run's queue arch:R:uploads, and it
writes once its ticket is among the first `sync.upload_slots` of the queue: it holds an
upload slot. syncd takes the ticket off once it has read the update's message and
verified it (or skipped a copy of a handled update), deleting the message from the
data plane then: syncd holds it while it checks and folds it, and the next ticket's
island writes meanwhile. So the data plane holds at most `upload_slots` update messages of the run,
where it held up to kept_sends per island and fragment (diloco/sizes.py). The queue is
first come, first served: an island waits in line while its tau overlap steps and its
send queue (trainer/link.py) keep it training.

Where the published fragments lie on the data plane too (SYNCD_SERVE off), a publish
holds its fragment twice there while it writes the new message (syncd.globals_store),
and syncd takes a slot for that time: it puts a publish ticket at the head of the queue
(`publish_ticket`), so the islands write into the U - 1 slots left. The updates written
before the publish began may still fill all U (syncd, the bottleneck of a busy run, has
not read them yet): the publish waits first, a moment at most, until syncd read one
(UpdateStream.slot_for_publish). So the data plane holds the fragment twice plus U - 1
update messages at a publish, whatever the number of islands, as at M = 2, where the
islands wait for the merge (bench dataplane, docs/journal/benchmarks-2026.md). An island that saw
its slot just before the publish began finishes its write, and a publish that waited
its limit goes on: the bound (diloco/sizes.py) stays the fragment twice plus U.

A ticket whose update never comes would hold its slot for good; syncd takes off a
ticket that holds a slot and is `stale`: it names no island of the run or an epoch
before the island's current one, its island is lost, its update is handled already
(a syncd that died between the fold and freeing the slot), or it held the slot for
SLOT_TIMEOUT_S with no update read. An island whose ticket went (it was taken for lost,
then came back) queues again. Islands only add tickets and read the queue; only syncd
takes tickets off. An island can queue tickets in another's name, which delays the
run's uploads and nothing else: it cannot make syncd merge or drop any update.

How long: an island writes one update at a time (its link's one thread queues the next
ticket only once the last update is written), so it has at most one ticket in the queue
whose update is not on the data plane. Where an island of the run has more (`crowded`),
the others were queued in its name: syncd takes all of them off at its next look,
wherever they are in the queue, and the island queues its own again. Tickets of real
islands' names, epochs and seqs ahead of them would otherwise hold each slot for
SLOT_TIMEOUT_S in turn: a flood of a thousand, hours of the run's uploads. The one
forged ticket left of an island with none of its own in the queue holds a slot for
SLOT_START_S at most, its update never written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# A slot held this long with no update read is given to the next ticket: far more than
# the write of the largest message at the transport's speed (bench dataplane).
SLOT_TIMEOUT_S = 60.0
# A slot held this long with none of its update written is given to the next ticket: an
# island that holds a slot starts its write within a poll (SLOT_POLL_MAX_S), so its
# ticket was queued in its name by another; the island queues again should it be its own.
SLOT_START_S = 10.0
PUBLISH = "publish"  # what a publish ticket starts with (`publish_ticket`)


@dataclass(frozen=True)
class Ticket:
    """An island's place in the queue for an upload slot: the update it will write."""

    island: str
    epoch: int
    fragment: int
    seq: int

    def encode(self) -> str:
        return f"{self.epoch}:{self.fragment}:{self.seq}:{self.island}"

    @classmethod
    def parse(cls, raw: bytes | str) -> Ticket | None:
        """The ticket `raw` names, or None if it is not one."""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        parts = text.split(":", 3)
        if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]) or not parts[3]:
            return None
        return cls(parts[3], int(parts[0]), int(parts[1]), int(parts[2]))


@dataclass(frozen=True)
class RunFacts:
    """What syncd knows of a run's islands that makes a ticket stale: the islands of
    the run, each one's current epoch, the lost ones, the newest handled seq of an
    island's fragment (`handled(island, fragment)`, -1 for none), and the fencing token
    of syncd's grant of the run's lease (its publish tickets name it)."""

    islands: set[str]
    epochs: dict[str, int]
    lost: set[str]
    handled: Callable[[str, int], int]
    fencing_token: int = 0


def publish_ticket(token: int, fragment: int, version: int) -> str:
    """The ticket of a publish of fragment `fragment` at `version` by the grant of the
    run's lease with fencing token `token` (no island's ticket parses as one)."""
    return f"{PUBLISH}:{token}:{fragment}:{version}"


def stale(raw: bytes, held_since: float, now: float, facts: RunFacts,
          written: bool = True) -> bool:
    """Whether a ticket that holds a slot since `held_since` is taken off: it names no
    island of the run or an epoch before the island's current one, its island is lost,
    its update is handled, it held the slot SLOT_START_S and its update is not
    `written` yet (an island that holds a slot writes within a poll of its link), or
    it held the slot SLOT_TIMEOUT_S with no update read. A
    publish ticket is stale if another grant of the lease wrote it (a syncd that died
    publishing) or it held the slot SLOT_TIMEOUT_S: one an island queued in syncd's
    name delays the uploads as a ticket in another island's name does, no longer."""
    if raw.startswith(PUBLISH.encode() + b":"):
        token = raw.split(b":")[1]
        return token != str(facts.fencing_token).encode() or now - held_since >= SLOT_TIMEOUT_S
    ticket = Ticket.parse(raw)
    if ticket is None or ticket.island not in facts.islands or ticket.island in facts.lost:
        return True
    return (ticket.epoch < facts.epochs.get(ticket.island, 0)
            or ticket.seq <= facts.handled(ticket.island, ticket.fragment)
            or now - held_since >= (SLOT_TIMEOUT_S if written else SLOT_START_S))


def crowded(queue: list[bytes], written: list[bool], islands: set[str]
            ) -> dict[str, list[bytes]]:
    """Island -> its tickets in `queue` (each `written` when its update is on the data
    plane) whose updates are not written, for each island of `islands` that has more
    than one such ticket; each ticket once."""
    unwritten: dict[str, dict[bytes, None]] = {}
    for raw, done in zip(queue, written, strict=True):
        ticket = Ticket.parse(raw)
        if ticket is not None and not done and ticket.island in islands:
            unwritten.setdefault(ticket.island, {})[raw] = None
    return {island: list(tickets) for island, tickets in unwritten.items()
            if len(tickets) > 1}


class SlotKeeper:
    """syncd's side: when each ticket that holds a slot was first seen holding it, and
    which of them are stale."""

    def __init__(self) -> None:
        self.held_since: dict[bytes, float] = {}

    def stale(self, holding: list[bytes], now: float, facts: RunFacts,
              written: list[bool] | None = None) -> list[bytes]:
        """The stale ones of the tickets `holding` slots now (syncd takes them off), each
        `written` when its update is on the data plane (all, if not told)."""
        self.held_since = {raw: self.held_since.get(raw, now) for raw in holding}
        return [raw for raw, done in zip(holding, written or [True] * len(holding),
                                         strict=True)
                if stale(raw, self.held_since[raw], now, facts, done)]
