"""Byte-level text corpora, split into train and eval, and one shard per island.

The default corpus is real text that every machine with Python has: the
standard library's own sources, read in sorted path order so that two machines
with the same Python see the same bytes (about 30 MiB, all of it). A run may
name its own text file or folder instead, of any size.

A corpus is read once into prepared byte files under the data directory
(`DATA_DIR`, default var/data), in prepared/<name>-<key>/, the key a hash of
the source's path and eval_fraction: train.bin, eval.bin and manifest.json,
which names each split's file and size, and the source's fingerprint (every
file's relative path, size and mtime). Each load stats the source's files; when
the fingerprint is not the manifest's, the files are built again. Building
holds an exclusive flock on the folder's lock file and writes temporary files
that are renamed into place, the manifest last: a crash leaves no half file,
and a process that waited for the lock finds the files finished. The splits
are opened as memory maps (torch.from_file), so opening reads nothing and the
islands of one host share the page cache; a batch reads only its windows.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import sysconfig
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".json", ".csv", ".html", ".c", ".h", ""}
SKIPPED_FOLDERS = {"site-packages", "__pycache__"}
# The layout of the prepared files; a change of it builds every corpus again.
FORMAT = 1
SPLITS = ("train", "eval")
MANIFEST = "manifest.json"
CHUNK = 8 * 1024 * 1024  # bytes read or copied at a time while preparing
DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent / "var" / "data"


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # uint8, 1-D
    eval: torch.Tensor  # uint8, 1-D
    source: str


def data_dir() -> Path:
    """The data directory: DATA_DIR, else var/data in the checkout. Read from the
    environment, since island processes do not load Django."""
    value = os.environ.get("DATA_DIR", "").strip()
    return Path(value) if value else DEFAULT_DATA_DIR


def default_corpus_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def text_files(root: Path, skip: Path | None = None) -> list[tuple[str, Path]]:
    """(relative path, path) of a corpus' candidate files, in sorted relative-path order.

    A folder's files with a text suffix, outside site-packages, __pycache__ and `skip`
    (the prepared corpora, when the data directory itself is the corpus).
    """
    if root.is_file():
        return [(root.name, root)]
    if not root.is_dir():
        raise ValueError(f"data.path {str(root)!r} is neither a file nor a folder")
    base = root.resolve()
    found = []
    for folder, subfolders, names in os.walk(base):
        subfolders[:] = [d for d in subfolders if d not in SKIPPED_FOLDERS
                         and Path(folder, d) != skip]
        for name in names:
            path = Path(folder, name)
            if path.suffix in TEXT_SUFFIXES and path.is_file():
                found.append((path.relative_to(base).as_posix(), path))
    return sorted(found)


def fingerprint(files: list[tuple[str, Path]]) -> str:
    """A digest of every file's relative path, size and mtime: what a rebuild waits for."""
    digest = hashlib.sha256()
    for rel, path in files:
        stat = path.stat()
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def prepared_folder(root: Path, eval_fraction: float, under: Path) -> Path:
    """Where the prepared files of `root` split with `eval_fraction` live."""
    key = hashlib.sha256(f"{root.resolve()}\0{eval_fraction!r}".encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", root.name)[:40] or "corpus"
    return under / "prepared" / f"{name}-{key}"


def load_corpus(path: str = "", eval_fraction: float = 0.05,
                directory: Path | None = None) -> Corpus:
    """A corpus split by file into train and eval, prepared once and memory-mapped.

    Args:
        path: a text file or a folder of text files; empty for the default corpus.
        eval_fraction: share of files (chosen by a hash of their path) held out.
        directory: the data directory; default data_dir().
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    root = Path(path) if path else default_corpus_root()
    under = directory or data_dir()
    folder = prepared_folder(root, eval_fraction, under)
    files = text_files(root, skip=(under / "prepared").resolve())
    current = fingerprint(files)
    folder.mkdir(parents=True, exist_ok=True)
    # The files are opened under the lock too, so no rebuild renames them mid-open.
    with _locked(folder / ".lock"):
        manifest = _manifest(folder)
        if not _is_current(manifest, folder, current):
            manifest = _prepare(root, files, eval_fraction, folder, current)
        train, held_out = (_open(folder / manifest["splits"][s]["file"],
                                 manifest["splits"][s]["bytes"]) for s in SPLITS)
    return Corpus(train=train, eval=held_out, source=str(root))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _is_current(manifest: dict[str, Any] | None, folder: Path, current: str) -> bool:
    """Whether the manifest is of this format and source state, with its files whole."""
    if not manifest or manifest.get("format") != FORMAT \
            or manifest.get("fingerprint") != current:
        return False
    try:
        return all((folder / manifest["splits"][s]["file"]).stat().st_size
                   == manifest["splits"][s]["bytes"] for s in SPLITS)
    except (OSError, KeyError, TypeError):
        return False


def _prepare(root: Path, files: list[tuple[str, Path]], eval_fraction: float, folder: Path,
             current: str) -> dict[str, Any]:
    """Write the splits and then the manifest, each to a temporary file renamed into place."""
    temps = {s: folder / f".{s}.bin.tmp" for s in SPLITS}
    used = 0
    try:
        with open(temps["train"], "w+b") as train, open(temps["eval"], "w+b") as held_out:
            for rel, file in files:
                is_eval = zlib.crc32(rel.encode()) % 1000 < eval_fraction * 1000
                used += _append_text(file, held_out if is_eval and root.is_dir() else train)
            if root.is_file() or held_out.tell() == 0:
                # One file, or too few files to hold some out: split the bytes instead.
                _move_tail(train, held_out, int(train.tell() * (1 - eval_fraction)))
            sizes = {"train": train.tell(), "eval": held_out.tell()}
            if sizes["train"] < 1024 or sizes["eval"] < 256:
                raise ValueError(f"corpus at {str(root)!r} is too small: "
                                 f"{sizes['train']} train and {sizes['eval']} eval bytes")
            for f in (train, held_out):
                f.flush()
                os.fsync(f.fileno())
        manifest = {"format": FORMAT, "source": str(root), "eval_fraction": eval_fraction,
                    "fingerprint": current, "files": used, "skipped": len(files) - used,
                    "splits": {s: {"file": f"{s}.bin", "bytes": sizes[s]} for s in SPLITS}}
        for s in SPLITS:
            temps[s].replace(folder / f"{s}.bin")
        temp = folder / f".{MANIFEST}.tmp"
        temp.write_text(json.dumps(manifest, indent=1))
        temp.replace(folder / MANIFEST)
        return manifest
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)


def _append_text(file: Path, out: BinaryIO) -> int:
    """Copy a text file to the end of `out`; 1 if copied, 0 for a binary file (a NUL
    byte), which leaves `out` as it was."""
    start = out.tell()
    with open(file, "rb") as f:
        while chunk := f.read(CHUNK):
            if b"\x00" in chunk:
                out.seek(start)
                out.truncate()
                return 0
            out.write(chunk)
    return 1


def _move_tail(source: BinaryIO, dest: BinaryIO, cut: int) -> None:
    """Move the bytes of `source` from `cut` on to the end of `dest`."""
    end = source.tell()
    source.seek(cut)
    while chunk := source.read(min(CHUNK, end - source.tell())):
        dest.write(chunk)
    source.seek(cut)
    source.truncate()


def _open(path: Path, size: int) -> torch.Tensor:
    """A split as a uint8 tensor over a private memory map of its file: opening reads
    nothing; what a slice touches is read then."""
    return torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)


class ShardSampler:
    """Random training windows from one island's disjoint shard of the train split."""

    def __init__(self, corpus: Corpus, shard: int, num_shards: int, block_size: int, seed: int):
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard must be between 0 and {num_shards - 1}, got {shard}")
        size = len(corpus.train) // num_shards
        if size <= block_size + 1:
            raise ValueError(f"each of {num_shards} shards has {size} bytes, "
                             f"fewer than block_size + 2 ({block_size + 2})")
        # A view: with a mapped corpus, only the windows a batch takes are read.
        self.data = corpus.train[shard * size:(shard + 1) * size]
        self.block_size = block_size
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + shard)

    def batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.data) - self.block_size - 1, (batch_size,),
                               generator=self.generator)
        x = torch.stack([self.data[s:s + self.block_size] for s in starts.tolist()])
        y = torch.stack([self.data[s + 1:s + 1 + self.block_size] for s in starts.tolist()])
        return x.long(), y.long()

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


def eval_batches(corpus: Corpus, tokens: int, block_size: int, batch_size: int = 32
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Evenly spaced windows over the eval split: the same ones for every run."""
    n = max(1, tokens // block_size)
    span = len(corpus.eval) - block_size - 1
    starts = torch.linspace(0, span, n).long().tolist()
    out = []
    for i in range(0, n, batch_size):
        chunk = starts[i:i + batch_size]
        x = torch.stack([corpus.eval[s:s + block_size] for s in chunk]).long()
        y = torch.stack([corpus.eval[s + 1:s + 1 + block_size] for s in chunk]).long()
        out.append((x, y))
    return out
