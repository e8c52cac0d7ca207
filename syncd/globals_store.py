"""The published globals: what syncd merged, for the islands to pull.

A merge is acknowledged when `publish` has committed: the new global fragment,
its version, the outer optimizer's momentum and the updates it took in are
written in one MULTI/EXEC, so a crash of syncd either loses the whole merge (and
the updates are merged again from the stream) or none of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.client import Pipeline

from syncd.bulk import BulkError, BulkRef
from syncd.run_keys import BLOB_TTL_S, RunKeys
from syncd.update_stream import UpdateRef

READ_TRIES = 5  # a reference read just before its message was replaced is read again


class GlobalsStore(RunKeys):
    """A run's published global fragments, their versions, momentum and handled seqs."""

    def publish(self, fragment: int, version: int, full: bytes | bytearray,
                difference: bytes | bytearray | None, momentum: bytes | bytearray,
                handled: dict[str, int], tokens: int, keep: int,
                merged: Iterable[UpdateRef] = ()) -> None:
        """Commit one merge: the new version, its messages, momentum and handled seqs,
        and the deletion of the merged updates' messages.

        The messages' chunks are written first, with a TTL, under names unique to this
        grant of the run's lease (its fencing token), so a syncd that lost the run can
        never overwrite or revive the new holder's chunks; the MULTI/EXEC that commits
        the merge, fenced by the lease, makes them persistent and points the run's
        references at them. It also deletes the messages the references named before
        (an island that was reading one reads the new one: `full`) and, with a lossy
        downlink, the difference `keep` versions back. So between the two steps one
        fragment is held twice, and never more.

        Raises:
            syncd.fence.LeaseLost: this store's lease is gone; nothing was published.
        """
        token = self.fence.token if self.fence is not None else 0
        pipe = self.client.pipeline(transaction=False)
        full_ref = self.bulk.put(self.key("full", fragment, version, token), full,
                                 BLOB_TTL_S, pipe)
        momentum_ref = self.bulk.put(self.key("momentum", fragment, version, token), momentum,
                                     BLOB_TTL_S, pipe)
        difference_ref = None if difference is None else self.bulk.put(
            self.key("pub", fragment, version, token), difference, BLOB_TTL_S, pipe)
        pipe.execute()
        merged = list(merged)
        # What the references name now: only the lease's holder changes them, and the
        # fenced transaction below is refused if that is no longer this store.
        replaced = {name: self._ref(self.key(name, fragment)) for name in ("full", "momentum")}
        old_pub = self.key("pub", fragment, version - keep)
        dropped_pub = self._ref(old_pub) if difference_ref is not None else None

        def fill(pipe: Pipeline) -> None:
            for ref, name in ((full_ref, "full"), (momentum_ref, "momentum")):
                self.bulk.persist(pipe, ref)
                pipe.set(self.key(name, fragment), ref.dumps())
                old = replaced[name]
                if old is not None and old.key != ref.key:
                    self.bulk.delete(pipe, old)
            if difference_ref is not None:
                self.bulk.persist(pipe, difference_ref)
                pipe.set(self.key("pub", fragment, version), difference_ref.dumps())
                pipe.delete(old_pub)
                if dropped_pub is not None:
                    self.bulk.delete(pipe, dropped_pub)
            if handled:
                pipe.hset(self.key("handled", fragment), mapping=handled)
            pipe.hset(self.key("versions"), fragment, version)
            pipe.hincrby(self.key("tokens_merged"), fragment, tokens)
            for ref in merged:
                self.bulk.delete(pipe, ref.blob)

        self._write(fill)

    def _ref(self, pointer: str) -> BulkRef | None:
        """The reference a pointer key holds, None if none."""
        raw = self.client.get(pointer)
        return None if raw is None else BulkRef.loads(raw)

    def mark_handled(self, fragment: int, handled: dict[str, int],
                     dropped: Iterable[UpdateRef] = ()) -> None:
        """Record seqs syncd is done with, and delete the messages of `dropped`."""
        dropped = list(dropped)
        if not handled and not dropped:
            return

        def fill(pipe: Pipeline) -> None:
            if handled:
                pipe.hset(self.key("handled", fragment), mapping=handled)
            for ref in dropped:
                self.bulk.delete(pipe, ref.blob)

        self._write(fill)

    def versions(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.client.hgetall(self.key("versions")).items()}

    def handled(self, fragment: int) -> dict[str, int]:
        raw = self.client.hgetall(self.key("handled", fragment))
        return {k.decode(): int(v) for k, v in raw.items()}

    def handled_seq(self, fragment: int, island: str) -> int:
        """The newest seq of the island's updates of `fragment` syncd is done with."""
        raw = self.client.hget(self.key("handled", fragment), island)
        return -1 if raw is None else int(raw)

    def _read(self, pointer: str, max_bytes: int) -> bytearray | None:
        """The message a reference key names; None if there is none. A reference read
        just before a newer message replaced it is read again."""
        for attempt in range(READ_TRIES):
            raw = self.client.get(pointer)
            if raw is None:
                return None
            try:
                return self.bulk.read(BulkRef.loads(raw), max_bytes)
            except BulkError:
                if attempt == READ_TRIES - 1:
                    raise
        return None

    def full(self, fragment: int, max_bytes: int = 1 << 40) -> bytearray | None:
        """The newest global fragment as a full message."""
        return self._read(self.key("full", fragment), max_bytes)

    def differences(self, fragment: int, versions: Iterable[int], max_bytes: int = 1 << 40
              ) -> list[bytearray | None]:
        """The published differences to these versions (None where one is gone)."""
        out: list[bytearray | None] = []
        for v in versions:
            try:
                out.append(self._read(self.key("pub", fragment, v), max_bytes))
            except BulkError:
                out.append(None)
        return out

    def momentum(self, fragment: int, max_bytes: int = 1 << 40) -> bytearray | None:
        return self._read(self.key("momentum", fragment), max_bytes)

    def tokens_merged(self) -> dict[int, int]:
        """Tokens behind the updates merged into each fragment."""
        raw = self.client.hgetall(self.key("tokens_merged"))
        return {int(k): int(v) for k, v in raw.items()}
