"""The newest published version of each fragment, in syncd's files: what a merge is
durable in.

The data plane (syncd.run_keys) keeps nothing on disk, so syncd writes each merge's
full message and outer momentum to a file of its own before it commits the merge
(syncd.rounds.Rounds.publish), once, and deletes the files of older versions after.
A restart of the data plane (or a syncd that takes the run over after one) publishes
the full message again from here; no append-only file carries them, so no rewrite of
one copies them again. The outer momentum is here only: islands never read it, so it
never goes to the data plane, and it is written straight from the optimizer's
tensors, without a copy of the whole. The folder is under the run's checkpoints
(CHECKPOINT_DIR), which every syncd that may serve the run reaches.

A file is written under a temporary name and renamed: a reader finds a whole file or
none. It is not fsynced: a crash of syncd, of Redis or of the data plane loses
nothing, and a power loss of syncd's host that tears the newest file is refused by
the message's signature on the way in, and the run rolls back to its checkpoint.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import torch

from diloco import tensorfile

_HEADER = struct.Struct("<QQ")  # the full message's bytes, the momentum's


class PublishedFiles:
    """One run's newest published messages per fragment, as files in `folder`."""

    def __init__(self, folder: Path):
        self.folder = folder

    @classmethod
    def of_run(cls, checkpoint_dir: str | Path, run_id: int | str) -> PublishedFiles:
        """The files of run `run_id`, beside its checkpoints."""
        return cls(Path(checkpoint_dir) / f"run-{run_id}" / "published")

    def _path(self, fragment: int, version: int) -> Path:
        return self.folder / f"{fragment}-{version}.published"

    def save(self, fragment: int, version: int, full: bytes | bytearray,
             momentum: dict[str, torch.Tensor]) -> int:
        """Write `fragment`'s full message and outer momentum (a safetensors file of the
        tensors) at `version`; returns the bytes written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(fragment, version)
        temporary = path.with_suffix(".tmp")
        with open(temporary, "wb") as f:
            f.write(_HEADER.pack(len(full), tensorfile.size(momentum)))
            f.write(full)
            momentum_bytes = tensorfile.write_file(f, momentum)
        os.replace(temporary, path)
        return _HEADER.size + len(full) + momentum_bytes

    def load(self, fragment: int, version: int, full: bool = True
             ) -> tuple[bytearray | None, dict[str, torch.Tensor]] | None:
        """(full message, outer momentum) of `fragment` at `version`; the full message
        is None when `full` is False (not read). None if there is no whole file of
        it."""
        path = self._path(fragment, version)
        try:
            with open(path, "rb") as f:
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    return None
                full_size, momentum_size = _HEADER.unpack(header)
                if _HEADER.size + full_size + momentum_size != os.fstat(f.fileno()).st_size:
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

    def clear(self) -> None:
        """Delete every file of the run: it ended, its final checkpoint holds the model."""
        if self.folder.is_dir():
            for path in self.folder.iterdir():
                path.unlink(missing_ok=True)
            self.folder.rmdir()

    def forget_before(self, fragment: int, version: int) -> None:
        """Delete `fragment`'s files of versions older than `version` (committed)."""
        if not self.folder.is_dir():
            return
        for path in self.folder.glob(f"{fragment}-*.published"):
            older = path.stem.split("-", 1)[1]
            if older.isdigit() and int(older) < version:
                path.unlink(missing_ok=True)
