"""The newest published version of each fragment, in syncd's files: what a merge is
durable in.

The data plane (syncd.run_keys) keeps nothing on disk, so syncd writes each merge's
full message and outer momentum to a file of its own before it commits the merge
(syncd.publisher.Publisher.publish), once. A restart of the data plane (or a syncd that
takes the run over after one) publishes the full message again from here; no
append-only file carries them, so no rewrite of one copies them again. The outer
momentum is here only: islands never read it, so it never goes to the data plane,
and it is written straight from the optimizer's tensors, without a copy of the
whole. The folder is under the run's checkpoints (CHECKPOINT_DIR), which every syncd
that may serve the run reaches.

Each grant of the run's lease (its fencing token, syncd.fence) writes files of its
own, so a syncd that lost the run and has not noticed yet can never write over the
file of a version its successor committed (both may merge a version of the same
number); the commit says which grant's file holds each fragment's newest version
(syncd.globals_store.GlobalsStore.fencing_tokens), and once a grant has committed a
fragment, the files of the other grants go (`keep_only`). Per grant, each fragment
has two files, one of its even versions and one of its odd, and
version v is written over v - 2, in place: the file of v - 1, the version committed
while v is written, is never touched, and a file's pages are written again where
they lie in the page cache. (A new file per version, renamed into place, had its
pages allocated afresh at every merge, which cost a VM more than the rest of the
merge; written in place, the file costs about a pass over memory.) The
version in the file's header is written last, once the rest is; until then it says
none, so a reader finds a whole version or none. It is not fsynced: a crash of
syncd, of Redis or of the data plane loses nothing, and a power loss of syncd's host
that tears the newest file is refused by the message's signature on the way in, and
the run rolls back to its checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import torch

from diloco import tensorfile
from syncd.bulk import as_pieces

# The version (_WRITING while the file is written), the full message's bytes, the
# momentum's.
_HEADER = struct.Struct("<qQQ")
_WRITING = -1


class PublishedFiles:
    """One run's newest published messages per fragment, as files in `folder`."""

    def __init__(self, folder: Path):
        self.folder = folder

    @classmethod
    def of_run(cls, checkpoint_dir: str | Path, run_id: int | str) -> PublishedFiles:
        """The files of run `run_id`, beside its checkpoints."""
        return cls(Path(checkpoint_dir) / f"run-{run_id}" / "published")

    def _path(self, fragment: int, version: int, token: int) -> Path:
        """The file grant `token` writes `version` of `fragment` to: its even or its odd
        one."""
        return self.folder / f"{fragment}-{token}-{'odd' if version % 2 else 'even'}.published"

    def save(self, fragment: int, version: int, token: int,
             full: bytes | bytearray | list[memoryview], momentum: dict[str, torch.Tensor]
             ) -> int:
        """Write `fragment`'s full message (or its pieces, in order) and outer momentum (a
        safetensors file of the tensors) at `version`, over its version - 2, in the files
        of the grant of fencing token `token`; returns the bytes written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(fragment, version, token)
        pieces = as_pieces(full)
        full_size = sum(piece.nbytes for piece in pieces)
        sizes = (full_size, tensorfile.size(momentum))
        with open(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+b") as f:
            f.write(_HEADER.pack(_WRITING, *sizes))
            for piece in pieces:
                f.write(piece)
            momentum_bytes = tensorfile.write_file(f, momentum)
            f.truncate()
            f.flush()
            f.seek(0)
            f.write(_HEADER.pack(version, *sizes))
        return _HEADER.size + full_size + momentum_bytes

    def load(self, fragment: int, version: int, token: int, full: bool = True
             ) -> tuple[bytearray | None, dict[str, torch.Tensor]] | None:
        """(full message, outer momentum) of `fragment` at `version`, as the grant of
        fencing token `token` saved it; the full message is None when `full` is False
        (not read). None if that file holds no whole version of it."""
        path = self._path(fragment, version, token)
        try:
            with open(path, "rb") as f:
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    return None
                saved, full_size, momentum_size = _HEADER.unpack(header)
                whole = _HEADER.size + full_size + momentum_size
                if saved != version or whole != os.fstat(f.fileno()).st_size:
                    return None
                message = bytearray(full_size) if full else None
                if message is None:
                    f.seek(full_size, os.SEEK_CUR)
                elif f.readinto(message) != full_size:
                    return None
                momentum = bytearray(momentum_size)
                if f.readinto(momentum) != momentum_size:
                    return None
        except FileNotFoundError:
            return None
        try:
            return message, tensorfile.loads(momentum)[1]
        except tensorfile.FormatError:
            return None

    @contextlib.contextmanager
    def full_file(self, fragment: int, version: int, token: int
                  ) -> Iterator[tuple[BinaryIO, int] | None]:
        """`fragment`'s full message at `version` in the file of the grant of fencing
        token `token`, for syncd's server (syncd.published_server): the open file,
        positioned at the message's first byte, and the message's size; None if that
        file holds no whole version of it. The file of `version` is written over only
        once `version` + 1 is committed, so a reader that sees the reference still
        naming `version` after its read read it whole (syncd.globals_store)."""
        try:
            f = open(self._path(fragment, version, token), "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            yield None
            return
        with f:
            header = f.read(_HEADER.size)
            whole = None
            if len(header) == _HEADER.size:
                saved, full_size, momentum_size = _HEADER.unpack(header)
                if saved == version and os.fstat(f.fileno()).st_size == \
                        _HEADER.size + full_size + momentum_size:
                    whole = (f, full_size)
            yield whole

    def keep_only(self, fragment: int, token: int) -> None:
        """Delete `fragment`'s files of every grant but `token`'s: it committed the
        fragment, so no other grant's file is read again."""
        for path in self.folder.glob(f"{fragment}-*.published"):
            if path.name.split("-")[1] != str(token):
                path.unlink(missing_ok=True)

    def clear(self) -> None:
        """Delete every file of the run: it ended, its final checkpoint holds the model."""
        if self.folder.is_dir():
            for path in self.folder.iterdir():
                path.unlink(missing_ok=True)
            self.folder.rmdir()
