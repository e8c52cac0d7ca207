"""The update stream: islands send their updates to syncd through it.

An update message is stored in chunks with a TTL on the data plane (nothing of it
reaches a disk) under a key named by its sender and place, (island, epoch,
fragment, seq), then referenced by an entry of the run's stream arch:R:updates on
the control Redis. syncd reads the entries in order, parses each one
alone (a malformed one is a `BadEntry`, never an error of the batch), reads the
message from the key it derives itself, and deletes it once it folded it into its
round (with its entry), refused or dropped it. An entry names no key: the worst it
can make syncd read or delete is the message of the update it names.

An island writes a message only while it holds an upload slot (syncd/upload_slots.py):
the run's queue arch:R:uploads on the data plane bounds the messages in flight.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import redis
from redis.client import Pipeline

from syncd.bulk import BulkRef, RedisBulk, max_chunks
from syncd.run_keys import BLOB_TTL_S, RunKeys
from syncd.upload_slots import Ticket, publish_ticket

STREAM_MAXLEN = 100_000
MAX_FIELD = 2**62  # the largest epoch, fragment, seq, chunk count or size an entry may give
MAX_ISLAND_NAME = 256
# The longest queue of upload slots syncd keeps: one ticket per island (at most 256)
# and a publish's, with room to spare; tickets past it are dropped (their islands, if
# honest, queue again), so a flood of tickets costs syncd's LREMs no more.
MAX_TICKETS = 1024
SLOT_POLL_S = 0.01  # an island next in line for a slot looks this often
SLOT_POLL_MAX_S = 0.2  # one further back, at most this seldom


@dataclass(frozen=True)
class UpdateRef:
    """A well-formed stream entry: what it claims, until the message it names is verified."""

    stream_id: bytes
    island: str
    epoch: int
    fragment: int
    seq: int
    blob: BulkRef


@dataclass(frozen=True)
class BadEntry:
    """A stream entry that cannot be parsed: `reason` says why."""

    stream_id: bytes
    reason: str


class UpdateStream(RunKeys):
    """A run's update stream and the update messages it references.

    `max_update_bytes`: the largest message an entry may claim (syncd sets it from the
    run's model, syncd.ingest.message_limit): a larger one is a BadEntry, so nothing an
    entry claims makes syncd read or delete more than the run's own model's worth.
    """

    max_update_bytes = MAX_FIELD

    def update_key(self, island: str, epoch: int, fragment: int, seq: int) -> str:
        """Where the message of an island's update lies: one key per (island, epoch,
        fragment, seq), so that an update sent again is the same update."""
        return self.key("blob", island, epoch, fragment, seq)

    def push_update(self, island: str, epoch: int, fragment: int, seq: int,
                    blob: bytes | bytearray) -> None:
        """Store an update message in chunks with a TTL on the data plane, then reference
        it from the stream (in that order, so syncd never reads an entry before its
        chunks).

        Raises:
            redis.OutOfMemoryError: the data plane is full; nothing was referenced.
        """
        ref = RedisBulk(self.data_writer, self.bulk.chunk_bytes).put(
            self.update_key(island, epoch, fragment, seq), blob, BLOB_TTL_S)
        entry = {"island": island, "epoch": epoch, "fragment": fragment, "seq": seq,
                 "chunks": ref.chunks, "bytes": ref.size}
        key = self.key("updates")
        self.own_write(self.writer, key, lambda: self.writer.xadd(
            key, entry, maxlen=STREAM_MAXLEN, approximate=True))

    def clear_after_end(self, island: str, epoch: int, fragment: int, seq: int,
                        size: int) -> None:
        """Delete what an update written as its run ended made again after syncd freed
        the run's keys: its message (of `size` bytes), the stream and the queue of
        upload slots, which hold nothing that will ever be merged. Nothing of it then
        waits for a TTL, or for ever on the control Redis."""
        ref = self.bulk.ref(self.update_key(island, epoch, fragment, seq), size)
        pipe = self.data_writer.pipeline(transaction=False)
        self.bulk.delete(pipe, ref)
        pipe.delete(self.key("uploads"))
        pipe.execute()
        self.writer.delete(self.key("updates"))

    def wait_for_slot(self, island: str, epoch: int, fragment: int, seq: int,
                      slots: int) -> float:
        """Queue for an upload slot for this update and return once it holds one (its
        ticket is among the first `slots` of the run's queue); the seconds waited. A
        ticket syncd took off (stale: the island was taken for lost, or an island deleted
        the queue) is queued again; a queue left of another type is made anew (own_write)."""
        ticket = Ticket(island, epoch, fragment, seq).encode()
        key = self.key("uploads")
        started = time.monotonic()
        writer = self.data_writer
        self.own_write(writer, key, lambda: writer.rpush(key, ticket))
        while True:
            place = self.own_write(writer, key, lambda: writer.lpos(key, ticket))
            if place is None:
                self.own_write(writer, key, lambda: writer.rpush(key, ticket))
            elif place < slots:
                return time.monotonic() - started
            else:
                time.sleep(min(SLOT_POLL_S * (place - slots + 1), SLOT_POLL_MAX_S))

    def slot_holders(self, slots: int) -> list[bytes]:
        """The tickets that hold the run's `slots` upload slots now; the queue is cut
        to its first MAX_TICKETS on the way."""
        pipe = self.data.pipeline(transaction=False)
        pipe.ltrim(self.key("uploads"), 0, MAX_TICKETS - 1)
        pipe.lrange(self.key("uploads"), 0, slots - 1)
        try:
            return pipe.execute()[1]
        except redis.ResponseError as exc:
            self.wrong_type(self.data, self.key("uploads"), exc)
            return []

    def queued(self) -> list[bytes]:
        """Every ticket in the run's queue of upload slots, in order; the queue is cut to
        its first MAX_TICKETS on the way."""
        pipe = self.data.pipeline(transaction=False)
        pipe.ltrim(self.key("uploads"), 0, MAX_TICKETS - 1)
        pipe.lrange(self.key("uploads"), 0, -1)
        try:
            return pipe.execute()[1]
        except redis.ResponseError as exc:
            self.wrong_type(self.data, self.key("uploads"), exc)
            return []

    @contextlib.contextmanager
    def slot_for_publish(self, fragment: int, version: int, slots: int,
                         drain_s: float = 0.0) -> Iterator[None]:
        """syncd: hold an upload slot, at the head of the line, while fragment
        `fragment`'s `version` is published, where its full message is written to the
        data plane (not `served`): the islands write into the `slots` - 1 slots left
        while the fragment is there twice (syncd/upload_slots.py). The updates written
        before the publish began may fill every slot still: for at most `drain_s` it
        waits first until syncd read one of them (its reading thread frees them)."""
        if self.served is not None:
            yield
            return
        key = self.key("uploads")
        ticket = publish_ticket(self.fencing_token, fragment, version)
        pipe = self.data.pipeline(transaction=True)
        pipe.lrange(key, 0, slots - 1)
        pipe.lpush(key, ticket)
        try:
            held, _ = pipe.execute()
        except redis.ResponseError as exc:  # an island made the queue another type
            self.wrong_type(self.data, key, exc)
            held = []
            self.data.lpush(key, ticket)
        try:
            deadline = time.monotonic() + drain_s
            while self._written(held) >= slots and time.monotonic() < deadline:
                time.sleep(SLOT_POLL_S)
            yield
        finally:
            self.data.lrem(key, 0, ticket)

    def _written(self, tickets: list[bytes]) -> int:
        """How many of these tickets' update messages are on the data plane."""
        return sum(self.written(tickets))

    def written(self, tickets: list[bytes]) -> list[bool]:
        """Whether each ticket's update message is on the data plane (its first chunk
        is; False for what is no ticket)."""
        parsed = [Ticket.parse(raw) for raw in tickets]
        pipe = self.data.pipeline(transaction=False)
        for t in parsed:
            if t is not None:
                pipe.exists(self.bulk.ref(self.update_key(t.island, t.epoch, t.fragment, t.seq),
                                          1).chunk_keys()[0])
        found = iter(pipe.execute())
        return [t is not None and bool(next(found)) for t in parsed]

    def free_slots(self, tickets: Iterable[bytes | str]) -> None:
        """Take these tickets off the queue (syncd: it is done with their updates, or
        they are stale); the next ones in line hold the slots."""
        pipe = self.data.pipeline(transaction=False)
        for ticket in tickets:
            pipe.lrem(self.key("uploads"), 0, ticket)
        try:
            pipe.execute()
        except redis.ResponseError as exc:
            self.wrong_type(self.data, self.key("uploads"), exc)

    def read_updates(self, after: bytes = b"0-0", count: int = 64, block_ms: int | None = None
                     ) -> list[UpdateRef | BadEntry]:
        """The entries after `after`, each parsed alone."""
        try:
            reply = self.client.xread({self.key("updates"): after}, count=count,
                                      block=block_ms)
        except redis.ResponseError as exc:
            self.wrong_type(self.client, self.key("updates"), exc)
            return []
        return [self.parse_entry(stream_id, fields)
                for _, entries in reply or [] for stream_id, fields in entries]

    def parse_entry(self, stream_id: bytes, fields: dict[bytes, bytes]) -> UpdateRef | BadEntry:
        """A stream entry as the update it claims to be, or why it is not one."""
        try:
            island = fields[b"island"].decode()
            if not 0 < len(island) <= MAX_ISLAND_NAME:
                raise ValueError(f"an island name of {len(island)} characters")
            epoch, fragment, seq, chunks, size = (
                _whole(fields[name]) for name in (b"epoch", b"fragment", b"seq", b"chunks",
                                                  b"bytes"))
        except KeyError as exc:
            return BadEntry(stream_id, f"malformed entry: no field {exc.args[0].decode()!r}")
        except ValueError as exc:
            return BadEntry(stream_id, f"malformed entry: {exc}")
        if size > self.max_update_bytes:
            return BadEntry(stream_id, f"malformed entry: a message of {size} bytes, past "
                                       f"the run's largest update ({self.max_update_bytes})")
        if not 1 <= chunks <= max_chunks(size):
            return BadEntry(stream_id, f"malformed entry: {chunks} chunks cannot hold "
                                       f"{size} bytes")
        return UpdateRef(stream_id, island, epoch, fragment, seq,
                         BulkRef(self.update_key(island, epoch, fragment, seq), chunks, size))

    def update_message(self, ref: UpdateRef, max_bytes: int) -> bytearray:
        """The update message a stream entry names.

        Raises:
            syncd.bulk.BulkError: too large, expired, missing or incomplete.
        """
        return self.bulk.read(ref.blob, max_bytes)

    def drop_updates(self, refs: Iterable[UpdateRef]) -> None:
        """Delete the messages of these updates (on the data plane, from keys syncd
        derived itself: unfenced, and nobody else's)."""
        refs = list(refs)
        if refs:
            pipe = self.data.pipeline(transaction=False)
            for ref in refs:
                self.bulk.delete(pipe, ref.blob)
            pipe.execute()

    def forget_updates(self, refs: Iterable[UpdateRef]) -> None:
        """Delete the stream entries of updates syncd has read and verified (one fenced
        write on the control Redis), then their messages (on the data plane): no
        syncd reads them again, not a restarted one either (the islands send again
        what a restart lost)."""
        refs = list(refs)
        if refs:
            self._on_stream(lambda pipe: pipe.xdel(self.key("updates"),
                                                   *[ref.stream_id for ref in refs]))
            self.drop_updates(refs)

    def forget_entries(self, stream_ids: Iterable[bytes]) -> None:
        """Delete stream entries that name no update syncd will ever take (quarantined):
        a restart or a rebuild of the run does not read them again."""
        ids = list(stream_ids)
        if ids:
            self._on_stream(lambda pipe: pipe.xdel(self.key("updates"), *ids))

    def trim_updates(self, min_id: bytes) -> None:
        """Forget stream entries older than `min_id`: all of them are handled."""
        self._on_stream(lambda pipe: pipe.xtrim(self.key("updates"), minid=min_id))

    def _on_stream(self, fill: Callable[[Pipeline], object]) -> None:
        """A fenced write to the update stream; a stream an island replaced with another
        type is deleted instead (made anew by the next entry)."""
        try:
            self._write(fill)
        except redis.ResponseError as exc:
            self.wrong_type(self.client, self.key("updates"), exc)


def _whole(raw: bytes) -> int:
    """A field that must be a whole number from 0 to MAX_FIELD, in plain decimal digits."""
    if not raw.isdigit() or len(raw) > 19:
        raise ValueError(f"{raw[:40]!r} is not a whole number")
    value = int(raw)
    if value > MAX_FIELD:
        raise ValueError(f"{value} is out of range")
    return value
