"""Hostile update-stream entries, written the way a client holding an island's Redis
credential can write them: what syncd must quarantine (syncd/quarantine.py).

`hostile_entries` builds the variants of a well-formed claim of a real island's
update: a forged huge seq, `chunks` of 0 or 10^10, a size past any message, a
missing, non-numeric, negative or 100-bit seq, an unknown island, a fragment the
run lacks, an entry of junk. None has a message signed for it. tests/syncd/
test_hostile_entries.py writes them beside a RunSync; the chaos soak's `hostile`
fault (bench/soak.py) writes them into a running run through an `Intruder`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from syncd.run_keys import BLOB_TTL_S, RunKeys
from syncd.update_stream import UpdateStream

# A seq no island of the soak reaches (seq is an island's inner step): the claims of
# the entries never meet a genuine update, so every entry is quarantined.
CLAIMED_SEQ = 10**12
UNSIGNED = b"\x00" * 64  # bytes where a signed update message should be
CANARY_TTL_S = 3600


def hostile_entries(claim: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The hostile variants of `claim` ({island, epoch, fragment, seq, chunks, bytes} of
    an update that does not exist), each with its name."""
    def without(name: str) -> dict[str, Any]:
        return {k: v for k, v in claim.items() if k != name}

    return [
        ("a huge seq", {**claim, "seq": 10**18}),
        ("no chunks", {**claim, "chunks": 0}),
        ("chunks past any message", {**claim, "chunks": 10**10}),
        ("a size past any message", {**claim, "bytes": 10**15, "chunks": 10**10}),
        ("no seq", without("seq")),
        ("a seq that is not a number", {**claim, "seq": "many"}),
        ("a negative seq", {**claim, "seq": -4}),
        ("a seq past 64 bits", {**claim, "seq": 10**30}),
        ("an unknown island", {**claim, "island": "mallory"}),
        ("a fragment the run lacks", {**claim, "fragment": 99}),
        ("nothing but junk", {"junk": "x"}),
        ("a handled seq with chunks its size cannot hold", {**claim, "seq": 1,
                                                            "chunks": 10**6}),
        ("a handled seq with a size past the model's", {**claim, "seq": 1, "bytes": 10**15,
                                                        "chunks": 9 * 10**11}),
    ]


def write_entry(stream: UpdateStream, fields: dict[str, Any]) -> bytes:
    """Add one entry straight to the run's update stream, with no message behind it."""
    return stream.client.xadd(stream.key("updates"), fields)


@dataclass
class Batch:
    """The hostile entries of one attack, and what became of them."""

    time: float  # wall clock, when they were written
    island: str  # the real island they name
    stream_ids: list[bytes]
    versions: dict[int, int]  # the run's published versions just before
    canary: str  # a key of the run outside every entry's own message
    quarantined_after_s: float | None = None  # once none is left in the stream
    canary_kept: bool | None = None  # read when they were quarantined


@dataclass
class Intruder:
    """Writes hostile entries into a running run's update stream with the Redis credential
    an island holds, and watches syncd quarantine them.

    Every entry also names, in a `key` field, a canary key of another run (an entry
    names no key: syncd derives a message's key itself); with each batch the run gets
    a canary of its own, the message key of the same claim on another fragment.

    Args:
        client: a connection with the islands' Redis credential.
        run_id: the run under attack.
        other_run_id: a run whose canary key the entries name.
    """

    client: redis.Redis
    run_id: int
    other_run_id: int
    batches: list[Batch] = field(default_factory=list)
    canary_value: bytes = field(default_factory=lambda: os.urandom(32))
    planted: bool = False

    def __post_init__(self) -> None:
        self.stream = UpdateStream(self.client, self.run_id)
        self.other_canary = RunKeys(self.client, self.other_run_id).key("full", 0)

    def attack(self, island: str, epoch: int, versions: dict[int, int]) -> Batch:
        """Write the hostile variants of a claim in `island`'s name at `epoch`, and one
        unsigned message under that claim's own key; `versions`: the run's now."""
        if not self.planted:
            self.client.set(self.other_canary, self.canary_value)
            self.planted = True
        claim = {"island": island, "epoch": epoch, "fragment": 0, "seq": CLAIMED_SEQ,
                 "chunks": 1, "bytes": len(UNSIGNED)}
        canary = self.stream.update_key(island, epoch, 1, CLAIMED_SEQ) + ":0"
        # with a TTL as every honest chunk has: syncd's key bounds delete one without
        self.client.set(canary, self.canary_value, ex=CANARY_TTL_S)
        ids = [write_entry(self.stream, {**fields, "key": self.other_canary})
               for _, fields in hostile_entries(claim)]
        unsigned = {**claim, "seq": CLAIMED_SEQ + 1}
        self.stream.bulk.put(self.stream.update_key(island, epoch, 0, unsigned["seq"]),
                             UNSIGNED, BLOB_TTL_S)
        ids.append(write_entry(self.stream, unsigned))
        batch = Batch(time.time(), island, ids, dict(versions), canary)
        self.batches.append(batch)
        return batch

    def watch(self) -> None:
        """Note each batch whose entries all left the stream (quarantined), and whether
        its canary was still there then."""
        for batch in self.batches:
            if batch.quarantined_after_s is not None:
                continue
            left = {stream_id for stream_id, _ in self.client.xrange(
                self.stream.key("updates"), min(batch.stream_ids), max(batch.stream_ids))}
            if left.isdisjoint(batch.stream_ids):
                batch.quarantined_after_s = round(time.time() - batch.time, 2)
                batch.canary_kept = self.client.get(batch.canary) == self.canary_value

    def other_canary_kept(self) -> bool:
        return self.client.get(self.other_canary) == self.canary_value

    def entries_written(self) -> int:
        return sum(len(batch.stream_ids) for batch in self.batches)
