"""The published globals: what syncd merged, for the islands to pull.

A merge is acknowledged when `publish` has committed: the references to the new
global fragment (and, with a lossy downlink, its difference), its version and the
updates it took in are written in one fenced MULTI/EXEC on the control Redis, so a
crash of syncd either loses the whole merge (and the islands send its updates again)
or none of it. syncd's own files of the newest version (syncd.published_files,
written before the commit) are what a merge is durable in. The full message is
served from that file by syncd (syncd.published_server: the reference is a
syncd.bulk.ServedRef) when syncd runs its server, and lies on the data plane
otherwise; differences lie on the data plane, which keeps nothing on disk:
`dataplane_lost` is how syncd sees that it restarted. The outer momentum is syncd's
alone: it lies in those files only, never where islands read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable

from redis.client import Pipeline

from diloco.config import MAX_PARAMS
from syncd.bulk import BulkError, BulkRef, ServedRef, as_pieces, load_ref, read_served
from syncd.run_keys import BLOB_TTL_S, RunKeys
from syncd.update_stream import UpdateRef

log = logging.getLogger("archipelago.syncd")
READ_TRIES = 5  # a reference read just before its message was replaced is read again
# The largest published message: MAX_PARAMS (2e9, diloco/config.py) float32 values in
# one fragment, and a header.
MAX_PUBLISHED_BYTES = 4 * MAX_PARAMS + (1 << 20)


class GlobalsStore(RunKeys):
    """A run's published global fragments, their versions and handled seqs."""

    def publish(self, fragment: int, version: int, full: bytes | bytearray | list[memoryview],
                difference: bytes | bytearray | None, handled: dict[str, int], tokens: int,
                keep: int, merged: Iterable[UpdateRef] = (),
                before_commit: Callable[[], object] | None = None) -> None:
        """Commit one merge: the new version, its messages and handled seqs, and the
        deletion of the merged updates' messages. `before_commit` is called once the
        messages are on the data plane and before the commit (syncd waits there for
        its files of the merge, written meanwhile); what it raises, nothing commits.

        With a server (`served`), the full message is not written to the data plane:
        its reference names the file `before_commit` finished, which syncd serves.

        Three steps. The messages' chunks are written to the data plane first, with a
        TTL, under names unique to this grant of the run's lease (its fencing token)
        and version, so a syncd that lost the run can never overwrite or revive the
        new holder's chunks. The MULTI/EXEC that commits the merge, on the control
        Redis and fenced by the lease, points the run's references at them. Then the
        data plane makes them persistent and deletes the messages the references named
        before (an island that was reading one reads the new one: `full`), with a
        lossy downlink the difference `keep` versions back, and the merged updates'.
        So one fragment is held twice for a moment, and never more; a crash between
        the last two steps leaves the new messages with their TTL, which the next
        syncd removes (`keep_published`).

        Raises:
            syncd.fence.LeaseLost: this store's lease is gone; nothing was published.
            redis.OutOfMemoryError: the data plane is full; nothing was published.
        """
        token = self.fencing_token
        full_ref, difference_ref = self._put_messages(fragment, version, token, full,
                                                      difference, before_commit)
        merged = list(merged)
        # What the reference names now: only the lease's holder changes it, and the
        # fenced transaction below is refused if that is no longer this store. Only a
        # reference syncd could have written is followed (`_own_ref`): of this fragment,
        # no larger than twice the new message, so no value in the key names another.
        limit = 2 * sum(piece.nbytes for piece in as_pieces(full)) + (1 << 20)
        replaced = self._own_ref(self.key("full", fragment), limit)
        old_pub = self.key("pub", fragment, version - keep)
        dropped_pub = self._own_ref(old_pub, limit) if difference_ref is not None else None
        self._commit(fragment, version, token, full_ref, difference_ref, old_pub, handled,
                     tokens)
        self._settle(full_ref, replaced, difference_ref, dropped_pub, merged)

    def _put_messages(self, fragment: int, version: int, token: int,
                      full: bytes | bytearray | list[memoryview],
                      difference: bytes | bytearray | None,
                      before_commit: Callable[[], object] | None,
                      ) -> tuple[BulkRef | ServedRef, BulkRef | None]:
        """publish's first step: the messages on the data plane with a TTL (the full one
        named by syncd's file instead when it serves it), then `before_commit`; what
        raises takes back what was written."""
        written: list[BulkRef] = []
        full_ref: BulkRef | ServedRef | None = None
        if self.served is not None:
            full_ref = self.served.ref(fragment, version, token,
                                       sum(piece.nbytes for piece in as_pieces(full)))
        try:
            if full_ref is None:
                full_ref = self.bulk.put(self.key("full", fragment, version, token), full,
                                         BLOB_TTL_S)
                written.append(full_ref)
            difference_ref = None if difference is None else self.bulk.put(
                self.key("pub", fragment, version, token), difference, BLOB_TTL_S)
            if difference_ref is not None:
                written.append(difference_ref)
            if before_commit is not None:
                before_commit()
        except BaseException:
            if written:
                self.data.delete(*(key for ref in written for key in ref.chunk_keys()))
            raise
        return full_ref, difference_ref

    def _commit(self, fragment: int, version: int, token: int, full_ref: BulkRef | ServedRef,
                difference_ref: BulkRef | None, old_pub: str, handled: dict[str, int],
                tokens: int) -> None:
        """publish's second step: the fenced MULTI/EXEC on the control Redis that points
        the references at the new messages and records the merge."""

        def fill(pipe: Pipeline) -> None:
            pipe.set(self.key("full", fragment), full_ref.dumps())
            if difference_ref is not None:
                pipe.set(self.key("pub", fragment, version), difference_ref.dumps())
                pipe.delete(old_pub)
            if handled:
                pipe.hset(self.key("handled", fragment), mapping=handled)
            pipe.hset(self.key("versions"), fragment, version)
            pipe.hset(self.key("fencing_tokens"), fragment, token)
            pipe.hincrby(self.key("tokens_merged"), fragment, tokens)

        self._write(fill)

    def _settle(self, full_ref: BulkRef | ServedRef, replaced: BulkRef | ServedRef | None,
                difference_ref: BulkRef | None, dropped_pub: BulkRef | ServedRef | None,
                merged: list[UpdateRef]) -> None:
        """publish's last step, once committed: the new messages made persistent, the
        ones the references named before and the merged updates' deleted. PERSIST and
        DEL take no memory: they pass on a full data plane."""
        pipe = self.data.pipeline(transaction=False)
        if isinstance(full_ref, BulkRef):
            self.bulk.persist(pipe, full_ref)
        if isinstance(replaced, BulkRef) and replaced != full_ref:
            self.bulk.delete(pipe, replaced)
        if difference_ref is not None:
            self.bulk.persist(pipe, difference_ref)
            if dropped_pub is not None:
                self.bulk.delete(pipe, dropped_pub)
        for ref in merged:
            self.bulk.delete(pipe, ref.blob)
        pipe.execute()

    def keep_published(self, fragment: int, versions: Iterable[int] = ()) -> None:
        """Remove the TTL of the messages the references of `fragment` name (its full
        message and the differences to `versions`): a syncd that took the run over
        finishes a publish whose last step its predecessor did not run."""
        pipe = self.data.pipeline(transaction=False)
        pointers = [self.key("full", fragment), *(self.key("pub", fragment, v) for v in versions)]
        for pointer in pointers:
            if isinstance(ref := self._own_ref(pointer, MAX_PUBLISHED_BYTES), BulkRef):
                self.bulk.persist(pipe, ref)
        pipe.execute()

    def mark_dataplane(self) -> None:
        """Say on the data plane that it holds this run's published messages (set once
        syncd restored or published them all there)."""
        self.data.set(self.key("dataplane"), 1)

    def dataplane_lost(self) -> bool:
        """Whether the data plane lost what `mark_dataplane` said it held: it restarted
        or was flushed, and the references name chunks that are gone."""
        return not self.data.exists(self.key("dataplane"))

    def dataplane_refusals(self) -> int:
        """How many writes the data plane refused for memory since it started (its
        INFO errorstats: every client's, not only this run's)."""
        stats = self.data.info("errorstats").get("errorstat_OOM") or {}
        return int(stats.get("count", 0)) if isinstance(stats, dict) else 0

    def dataplane_memory(self) -> str:
        """The data plane's memory in use and its limit, in words."""
        info = self.data.info("memory")
        limit = int(info.get("maxmemory", 0))
        return (f"{int(info.get('used_memory', 0)) / 2**20:.1f} MiB used of "
                + (f"{limit / 2**20:.0f} MiB maxmemory" if limit else "no maxmemory"))

    def _own_ref(self, pointer: str, max_bytes: int) -> BulkRef | ServedRef | None:
        """The reference a pointer key holds if syncd could have written it: a served one,
        or chunks named as syncd names them (`<pointer>:<version>:<token>` for a full
        message, `<pointer>:<token>` for a difference) of at most `max_bytes`, in as
        many chunks as their size allows; None otherwise (none, not a reference, or
        another's: logged, and left alone)."""
        raw = self.client.get(pointer)
        if raw is None:
            return None
        try:
            ref = load_ref(raw)
            if isinstance(ref, BulkRef):
                if not re.fullmatch(re.escape(pointer) + r"(:\d{1,20}){1,2}", ref.key):
                    raise BulkError(f"it names {ref.key[:120]!r}")
                ref.check(max_bytes)
        except BulkError as exc:
            log.warning("run %s: %s holds no reference of syncd's (%s): left alone",
                        self.run_id, pointer, exc)
            return None
        return ref

    def mark_handled(self, fragment: int, handled: dict[str, int],
                     dropped: Iterable[UpdateRef] = ()) -> None:
        """Record seqs syncd is done with, and delete the messages of `dropped`."""
        dropped = list(dropped)
        if not handled and not dropped:
            return

        if handled:
            self._write(lambda pipe: pipe.hset(self.key("handled", fragment), mapping=handled))
        if dropped:
            pipe = self.data.pipeline(transaction=False)
            for ref in dropped:
                self.bulk.delete(pipe, ref.blob)
            pipe.execute()

    def versions(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.client.hgetall(self.key("versions")).items()}

    def fencing_tokens(self) -> dict[int, int]:
        """The fencing token of the grant that committed each fragment's newest version:
        the name of its file among syncd's files (syncd.published_files)."""
        raw = self.client.hgetall(self.key("fencing_tokens"))
        return {int(k): int(v) for k, v in raw.items()}

    def handled(self, fragment: int) -> dict[str, int]:
        raw = self.client.hgetall(self.key("handled", fragment))
        return {k.decode(): int(v) for k, v in raw.items()}

    def handled_seq(self, fragment: int, island: str) -> int:
        """The newest seq of the island's updates of `fragment` syncd is done with."""
        raw = self.client.hget(self.key("handled", fragment), island)
        return -1 if raw is None else int(raw)

    def handled_seqs(self, fragments: Iterable[int], island: str) -> dict[int, int]:
        """fragment -> the newest seq of the island's updates of it syncd is done with
        (-1: none yet), each of `fragments`, in one round trip."""
        fragments = list(fragments)
        pipe = self.client.pipeline(transaction=False)
        for fragment in fragments:
            pipe.hget(self.key("handled", fragment), island)
        return {f: -1 if raw is None else int(raw) for f, raw in zip(fragments, pipe.execute(),
                                                                     strict=True)}

    def _read(self, pointer: str, max_bytes: int) -> bytearray | None:
        """The message a reference key names; None if there is none. A reference read
        just before a newer message replaced it is read again, and so is a served
        message the reference no longer names once it is read (its file may have been
        written over meanwhile, syncd.published_files.PublishedFiles.full_file)."""
        for attempt in range(READ_TRIES):
            raw = self.client.get(pointer)
            if raw is None:
                return None
            try:
                ref = load_ref(raw)
                if isinstance(ref, BulkRef):
                    return self.bulk.read(ref, max_bytes)
                message = read_served(ref, max_bytes)
                if self.client.get(pointer) == raw:
                    return message
                if attempt == READ_TRIES - 1:
                    raise BulkError(f"{ref.url} was replaced while it was read")
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

    def tokens_merged(self) -> dict[int, int]:
        """Tokens behind the updates merged into each fragment."""
        raw = self.client.hgetall(self.key("tokens_merged"))
        return {int(k): int(v) for k, v in raw.items()}
