"""Bounds on what islands write, held by syncd: what no Redis ACL can bound.

A Redis user's key patterns and commands say which keys an island may write
(syncd/acl.py), never how many or how large: Redis has no memory limit per user or
per key (maxmemory is the whole server's, and with `noeviction` a full Redis
refuses every client's writes). So the server bounds one value (the Redis the
project starts refuses any argument over `proto-max-bulk-len`,
webapp.processes.MAX_VALUE_MB), and syncd bounds the count and the size of what
a run's islands leave: every BOUNDS_EVERY_S it looks at the run's island-written keys
and deletes what no island of the run writes honestly, each cause a `rejection`
event with its count (at most one a minute per cause):

- heartbeat fields that name no island of the run, or longer than MAX_SIGNAL_BYTES;
- cursors and faults longer than that, or under a name that is no island of the run;
- update message chunks on the data plane without the TTL every honest chunk has,
  or longer than a chunk.

Each look reads at most MAX_SCAN keys or fields of each kind (SCAN and HSCAN, never
KEYS): a flood larger than that is cut down over a few looks. The update stream and
the queue of upload slots are bounded where syncd reads them (syncd/update_stream.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

import redis

from syncd.island_signals import MAX_SIGNAL_BYTES

if TYPE_CHECKING:
    from syncd.hooks import Recorder
    from syncd.store import RunStore

log = logging.getLogger("archipelago.syncd")
BOUNDS_EVERY_S = 5.0
MAX_SCAN = 10_000  # keys or fields read per kind at each look
EVENT_EVERY_S = 60.0  # one rejection event per cause this often at most


@dataclass
class KeyBounds:
    """The bounds on one run's island-written keys.

    Args:
        store: the run's keys.
        recorder: the run's rows (its rejection events).
        islands: the names of the run's islands, as its spec has them now.
    """

    store: RunStore
    recorder: Recorder
    islands: Callable[[], list[str]]
    next_look: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)  # cause -> since its last event
    next_event: dict[str, float] = field(default_factory=dict)

    def look(self, now: float) -> None:
        """Delete what islands left beyond the bounds, if a look is due."""
        if now < self.next_look:
            return
        self.next_look = now + BOUNDS_EVERY_S
        islands = set(self.islands())
        self._heartbeats(islands)
        for kind in ("cursor", "fault"):
            self._signals(kind, islands)
        self._chunks()
        self._record(now)

    def _heartbeats(self, islands: set[str]) -> None:
        client, key = self.store.client, self.store.key("heartbeats")
        if client.type(key) != b"hash":
            return  # none, or of the wrong type: its reader deletes it
        junk = [name for name, _ in islice(client.hscan_iter(key, count=1000), MAX_SCAN)
                if _text(name) not in islands]
        long = [name for name in islands
                if client.hstrlen(key, name) > MAX_SIGNAL_BYTES]
        for cause, fields in (("heartbeat_of_no_island", junk), ("heartbeat_too_long", long)):
            for batch in _batches(fields):
                client.hdel(key, *batch)
            self._count(cause, len(fields))

    def _signals(self, kind: str, islands: set[str]) -> None:
        client = self.store.client
        prefix = self.store.key(kind, "")
        junk, long = [], []
        for key in islice(client.scan_iter(match=_glob(prefix) + "*", count=1000), MAX_SCAN):
            if _text(key)[len(prefix):] not in islands:
                junk.append(key)
            elif client.type(key) == b"string" and client.strlen(key) > MAX_SIGNAL_BYTES:
                long.append(key)
        for cause, keys in ((f"{kind}_of_no_island", junk), (f"{kind}_too_long", long)):
            for batch in _batches(keys):
                client.unlink(*batch)
            self._count(cause, len(keys))

    def _chunks(self) -> None:
        data, limit = self.store.data, self.store.bulk.chunk_bytes
        pattern = _glob(self.store.key("blob", "")) + "*"
        doomed = []
        for key in islice(data.scan_iter(match=pattern, count=1000), MAX_SCAN):
            try:
                if data.ttl(key) == -1 or data.strlen(key) > limit:
                    doomed.append(key)
            except redis.ResponseError:  # not a string: no chunk
                doomed.append(key)
        for batch in _batches(doomed):
            data.unlink(*batch)
        self._count("chunk_out_of_bounds", len(doomed))

    def _count(self, cause: str, n: int) -> None:
        if n:
            self.counts[cause] = self.counts.get(cause, 0) + n

    def _record(self, now: float) -> None:
        for cause, n in self.counts.items():
            if n and now >= self.next_event.get(cause, 0.0):
                log.warning("run %s: deleted %d island-written values (%s)",
                            self.store.run_id, n, cause)
                self.recorder.event("rejection", None, cause=cause, deleted=n,
                                    reason=REASONS[cause])
                self.counts[cause] = 0
                self.next_event[cause] = now + EVENT_EVERY_S


_TOO_LONG = f"longer than {MAX_SIGNAL_BYTES} bytes"
REASONS = {
    "heartbeat_of_no_island": "heartbeat fields that name no island of the run",
    "heartbeat_too_long": f"heartbeats {_TOO_LONG}",
    "cursor_of_no_island": "cursor keys that name no island of the run",
    "cursor_too_long": f"cursors {_TOO_LONG}",
    "fault_of_no_island": "fault keys that name no island of the run",
    "fault_too_long": f"faults {_TOO_LONG}",
    "chunk_out_of_bounds": "update message chunks without a TTL, of another type or "
                           "longer than a chunk",
}


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _glob(prefix: str) -> str:
    """`prefix` with Redis's glob characters escaped (a run id is a number, but still)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)


def _batches(items: list, size: int = 500) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
