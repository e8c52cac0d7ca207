"""The update stream: islands send their updates to syncd through it.

An update message is stored in chunks with a TTL, then referenced by an entry of
the run's stream arch:R:updates. syncd reads the entries in order, reads each
message, and deletes it once it merged, refused or dropped it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from syncd.bulk import BulkRef
from syncd.run_keys import BLOB_TTL_S, RunKeys

STREAM_MAXLEN = 100_000


@dataclass(frozen=True)
class UpdateRef:
    stream_id: bytes
    island: str
    epoch: int
    fragment: int
    seq: int
    blob: BulkRef


class UpdateStream(RunKeys):
    """A run's update stream and the update messages it references."""

    def push_update(self, island: str, epoch: int, fragment: int, seq: int,
                    blob: bytes | bytearray) -> None:
        """Store an update message in chunks with a TTL, then reference it from the
        stream (in that order, so syncd never reads an entry before its chunks)."""
        pipe = self.client.pipeline(transaction=False)
        ref = self.bulk.put(self.key("blob", uuid.uuid4().hex), blob, BLOB_TTL_S, pipe)
        pipe.xadd(self.key("updates"), {"island": island, "epoch": epoch, "fragment": fragment,
                                        "seq": seq, "key": ref.key, "chunks": ref.chunks,
                                        "bytes": ref.size},
                  maxlen=STREAM_MAXLEN, approximate=True)
        pipe.execute()

    def read_updates(self, after: bytes = b"0-0", count: int = 64, block_ms: int | None = None
                     ) -> list[UpdateRef]:
        reply = self.client.xread({self.key("updates"): after}, count=count, block=block_ms)
        refs = []
        for _, entries in reply or []:
            for stream_id, f in entries:
                blob = BulkRef(f[b"key"].decode(), int(f[b"chunks"]), int(f[b"bytes"]))
                refs.append(UpdateRef(stream_id, f[b"island"].decode(), int(f[b"epoch"]),
                                      int(f[b"fragment"]), int(f[b"seq"]), blob))
        return refs

    def update_message(self, ref: UpdateRef, max_bytes: int) -> bytearray:
        """The update message a stream entry names.

        Raises:
            syncd.bulk.BulkError: too large, expired, missing or incomplete.
        """
        return self.bulk.read(ref.blob, max_bytes)

    def drop_updates(self, refs: Iterable[UpdateRef]) -> None:
        """Delete the messages of updates syncd refused or threw away."""
        refs = list(refs)
        if refs:
            self._write(lambda pipe: [self.bulk.delete(pipe, ref.blob) for ref in refs])

    def trim_updates(self, min_id: bytes) -> None:
        """Forget stream entries older than `min_id`: all of them are handled."""
        self._write(lambda pipe: pipe.xtrim(self.key("updates"), minid=min_id))

    def newest_update_id(self) -> bytes | None:
        """The id of the newest entry in the update stream, None while it is empty."""
        newest = self.client.xrevrange(self.key("updates"), count=1)
        return newest[0][0] if newest else None
