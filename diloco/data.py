"""Byte-level text corpora, split into train, validation and test, and one shard per island.

The default corpus is real text that every machine with Python has: the
standard library's own sources, read in sorted path order so that two machines
with the same Python see the same bytes (about 30 MiB, all of it). A run may
name its own text file or folder instead, of any size.

A corpus is read once into prepared byte files under the data directory
(`DATA_DIR`, default var/data), in prepared/<name>-<key>/, the key a hash of
the source's path, eval_fraction and the layout's FORMAT: train.bin,
validation.bin, test.bin and manifest.json, which names each split's file and
size, and the source's fingerprint (every file's relative path, size and
mtime). Each load stats the source's files; when the fingerprint is not the
manifest's, the files are built again. Building holds an exclusive flock on the
folder's lock file and writes temporary files that are renamed into place, the
manifest last: a crash leaves no half file,
and a process that waited for the lock finds the files finished. The splits
are opened as memory maps (torch.from_file), so opening reads nothing and the
islands of one host share the page cache; a batch reads only its windows.

The two held-out splits have two readers that must not mix. Validation is what
the running system evaluates (syncd's live eval loss, the in-process cluster's
curve) and what any tuning compares; test is read only for the figures a
benchmark reports, so that no setting was chosen by looking at them.

Under a tokenizer other than bytes (`data.tokenizer`, diloco/tokenizer.py), or with
JSON Lines or Parquet files among the corpus' (diloco/documents.py), the splits hold
token ids instead (uint8 for bytes, uint16 below 65,536 ids, else uint32), each
document followed by the tokenizer's EOS (diloco/prepare.py), and the folder's key
holds the tokenizer (its kind and size, or its file's sha256) and data.text_field.
The manifest then names the tokenizer (its sha256, a `train` one's file beside the
splits), the records skipped, and `bytes_per_token`: for each held-out split, the
UTF-8 bytes of its text per token, measured on that split, which bits per byte of a
loss on it divides by (a manifest of ids without it, from an earlier preparation, is
prepared again).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from diloco import tokenizer as tokenizers
from diloco.documents import RECORD_SUFFIXES, Progress, Skipped, is_record_file
from diloco.prepare import CHUNK, HELD_OUT, SPLITS, Source, prepare_tokens, split_of
from diloco.prepare import move_tail as _move_tail

TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".json", ".csv", ".html", ".c", ".h", "",
                 *RECORD_SUFFIXES}
SKIPPED_FOLDERS = {"site-packages", "__pycache__"}
# The layout of the prepared files; part of the folder's key, so a change of it
# builds every corpus again in a folder of its own (2: validation and test, where
# 1 had one eval split).
FORMAT = 2
MANIFEST = "manifest.json"
TORCH_DTYPES = {"uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32}


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # token ids (uint8, uint16 or uint32), 1-D, like the other two
    validation: torch.Tensor  # live evaluation and tuning
    test: torch.Tensor  # the benchmarks' reported figures only
    source: str
    meta: dict[str, Any] = field(default_factory=dict)  # the prepared files' manifest
    folder: str = ""  # where the prepared files lie

    @property
    def tokenizer_sha256(self) -> str:
        """The sha256 of the tokenizer's tokenizer.json; `bytes` for the bytes one."""
        return (self.meta.get("tokenizer") or {}).get("sha256", tokenizers.BYTES)

    def tokenizer_json(self) -> str | None:
        """The tokenizer's tokenizer.json, kept beside the prepared files; None for bytes."""
        file = (self.meta.get("tokenizer") or {}).get("file")
        return (Path(self.folder) / file).read_text() if file and self.folder else None

    def held_out(self, split: str) -> torch.Tensor:
        """The held-out split named `split`: "validation" or "test"."""
        if split not in HELD_OUT:
            raise ValueError(f"split must be one of {', '.join(HELD_OUT)}, got {split!r}")
        return self.validation if split == "validation" else self.test


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


def prepared_folder(root: Path, eval_fraction: float, under: Path, tokens: str = "") -> Path:
    """Where the prepared files of `root` split with `eval_fraction` live. The key holds
    FORMAT, so that a folder of another layout (the two splits of format 1) is never
    read as this one's, nor rebuilt under a process that still reads it, and `tokens`,
    what the token ids are made with ("" for the bytes of text files)."""
    extra = f"\0{tokens}" if tokens else ""
    key = hashlib.sha256(f"{root.resolve()}\0{eval_fraction!r}\0{FORMAT}{extra}".encode()
                         ).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", root.name)[:40] or "corpus"
    return under / "prepared" / f"{name}-{key}"


def load_corpus(path: str, eval_fraction: float, directory: Path,
                tokenizer: str = tokenizers.BYTES,
                vocab_size: int = tokenizers.BYTE_VOCAB, text_field: str = "text",
                watch: Callable[[Progress], None] | None = None) -> Corpus:
    """A corpus split by file (or by record) into train, validation and test, prepared
    once and memory-mapped.

    Args:
        path: a text file, a JSON Lines or Parquet file, or a folder of them; empty for
            the default corpus.
        eval_fraction: share of files (chosen by a hash of their path; records by a hash
            of their path and line or row) in each held-out split: validation and test
            hold eval_fraction each, train the rest.
        directory: the data directory (DATA_DIR, syncd.environment.data_dir), where
            the corpus is prepared.
        tokenizer, vocab_size, text_field: data.tokenizer, data.vocab_size (of a `train`
            tokenizer) and data.text_field (of a record's text).
        watch: handed each preparing pass's Progress as it begins (none where the
            prepared files are current).

    Raises:
        ValueError: the corpus is too small, or a Parquet file has no such column;
            diloco.tokenizer.TokenizerError (a ValueError): no tokenizer in the folder.
    """
    if not 0.0 < eval_fraction < 0.5:
        raise ValueError(f"eval_fraction must be between 0 and 0.5, got {eval_fraction}")
    root = Path(path) if path else default_corpus_root()
    files = text_files(root, skip=(directory / "prepared").resolve())
    source = Source(root, files, eval_fraction, text_field, tokenizer, vocab_size, watch)
    as_bytes = tokenizer == tokenizers.BYTES and not any(is_record_file(p) for _, p in files)
    folder = prepared_folder(root, eval_fraction, directory,
                             "" if as_bytes else _tokens_key(source))
    current = fingerprint(files)
    folder.mkdir(parents=True, exist_ok=True)
    # The files are opened under the lock too, so no rebuild renames them mid-open.
    with _locked(folder / ".lock"):
        manifest = _manifest(folder)
        if not _is_current(manifest, folder, current):
            manifest = _prepare(source, folder, current, as_bytes)
        dtype = TORCH_DTYPES[manifest.get("dtype", "uint8")]
        splits = {s: _open(folder / manifest["splits"][s]["file"],
                           manifest["splits"][s]["bytes"], dtype) for s in SPLITS}
    return Corpus(**splits, source=str(root), meta=manifest, folder=str(folder))


def run_corpus(data: Any, directory: Path,
               watch: Callable[[Progress], None] | None = None) -> Corpus:
    """The corpus of a run's `data` section (diloco.config.DataConfig), prepared in the
    data directory `directory`; `watch` as load_corpus's."""
    return load_corpus(data.path, data.eval_fraction, directory, tokenizer=data.tokenizer,
                       vocab_size=data.vocab_size, text_field=data.text_field, watch=watch)


# The fields of a run's `data` section that its prepared files depend on: a warm
# standby is told them (trainer.pool.warm_for) and its corpus is known by them.
CORPUS_FIELDS = ("path", "eval_fraction", "tokenizer", "vocab_size", "text_field")


def corpus_key(data: Any) -> tuple[str, float, str, int, str]:
    """What a corpus opened ahead of its run (a warm standby's) is known by: of a run's
    `data` section (diloco.config.DataConfig), all that its prepared files depend on,
    the path, eval_fraction, tokenizer, vocab_size (a `train` tokenizer's; 0 for the
    others) and text_field."""
    vocab = data.vocab_size if data.tokenizer == tokenizers.TRAIN else 0
    return (data.path or "", float(data.eval_fraction), data.tokenizer, vocab, data.text_field)


def tokenizer_json(data: Any, directory: Path) -> str | None:
    """The tokenizer.json of a run's tokenizer (`data`: diloco.config.DataConfig), the
    corpus prepared for it in `directory` if it is not yet (a `train` one is trained
    then); None for bytes."""
    if data.tokenizer == tokenizers.BYTES:
        return None
    return run_corpus(data, directory).tokenizer_json()


def batch_shortfall(corpus_bytes: int, eval_fraction: float, islands: int, block_size: int,
                    batch_size: int) -> str:
    """Why a corpus of `corpus_bytes` holds less than one batch (batch_size windows of
    block_size + 1 tokens) in each of `islands` shards of its train split ("" when it
    holds one). A token is at least about a byte, so the bytes bound the tokens."""
    shard = int(corpus_bytes * (1 - 2 * eval_fraction)) // islands
    need = batch_size * (block_size + 1)
    if shard >= need:
        return ""
    return (f"The corpus holds {corpus_bytes:,} bytes: each of the {islands} islands' shards "
            f"of its train split about {shard:,} tokens at most, fewer than one batch of "
            f"{need:,} (batch_size x (model.block_size + 1)); give a larger corpus.")


def _tokens_key(source: Source) -> str:
    """What the token ids are made with: the tokenizer (a folder's by the sha256 of its
    tokenizer.json, so an edited one prepares anew) and the records' text field."""
    kind = source.tokenizer
    if kind == tokenizers.TRAIN:
        kind = f"train:{source.vocab_size}"
    elif kind != tokenizers.BYTES:
        tokenizers.read_json(kind)  # a folder without one says so here
        file = Path(kind.strip()).expanduser() / tokenizers.TOKENIZER_FILE
        kind = "folder:" + hashlib.sha256(file.read_bytes()).hexdigest()
    return f"{kind}\0{source.text_field}"


@contextlib.contextmanager
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
            or manifest.get("fingerprint") != current \
            or ("tokenizer" in manifest and "bytes_per_token" not in manifest):
        return False
    try:
        return all((folder / manifest["splits"][s]["file"]).stat().st_size
                   == manifest["splits"][s]["bytes"] for s in SPLITS)
    except (OSError, KeyError, TypeError):
        return False


def _prepare(source: Source, folder: Path, current: str, as_bytes: bool) -> dict[str, Any]:
    """Write the splits and then the manifest, each to a temporary file renamed into place."""
    temps = {s: folder / f".{s}.bin.tmp" for s in SPLITS}
    try:
        facts = _copy_bytes(source, temps) if as_bytes else prepare_tokens(source, folder, temps)
        manifest = {"format": FORMAT, "source": str(source.root),
                    "eval_fraction": source.eval_fraction, "fingerprint": current, **facts,
                    "splits": {s: {"file": f"{s}.bin", "bytes": temps[s].stat().st_size}
                               for s in SPLITS}}
        for s in SPLITS:
            temps[s].replace(folder / f"{s}.bin")
        temp = folder / f".{MANIFEST}.tmp"
        temp.write_text(json.dumps(manifest, indent=1))
        temp.replace(folder / MANIFEST)
        return manifest
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)


def _copy_bytes(source: Source, temps: dict[str, Path]) -> dict[str, Any]:
    """The bytes of text files, each file whole in its split, copied as they are."""
    used = 0
    skipped = Skipped()
    progress = source.progress("copying", skipped)
    with contextlib.ExitStack() as stack:
        out = {s: stack.enter_context(open(temps[s], "w+b")) for s in SPLITS}
        for rel, file in source.files:
            split = split_of(rel, source.eval_fraction) if source.root.is_dir() else "train"
            copied = _append_text(file, out[split])
            used += copied
            progress.documents += copied
            skipped.binary_files += 1 - copied
            progress.add(file.stat().st_size)
        progress.done()
        # One file, or too few files to hold some out: a held-out split left empty
        # takes eval_fraction of the bytes from the end of train instead. Validation
        # takes the very end, which format 1 held out as eval, and test the share
        # before it, which was train: a single file reads train, test, validation.
        share = int(out["train"].tell() * source.eval_fraction)
        for split in HELD_OUT:
            if out[split].tell() == 0:
                _move_tail(out["train"], out[split], out["train"].tell() - share)
        sizes = {s: f.tell() for s, f in out.items()}
        if sizes["train"] < 1024 or min(sizes[s] for s in HELD_OUT) < 256:
            raise ValueError(f"corpus at {str(source.root)!r} is too small: " + ", ".join(
                f"{sizes[s]} {s}" for s in SPLITS) + " bytes")
        for f in out.values():
            f.flush()
            os.fsync(f.fileno())
    return {"files": used, "skipped": len(source.files) - used}


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


def _open(path: Path, size: int, dtype: torch.dtype) -> torch.Tensor:
    """A split of `size` bytes as a tensor of `dtype` over a private memory map of its
    file: opening reads nothing; what a slice touches is read then."""
    return torch.from_file(str(path), shared=False, size=size // dtype.itemsize, dtype=dtype)


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


def bytes_per_token(meta: dict[str, Any], split: str) -> float:
    """Bytes of source text per token of the held-out `split` ("validation" or "test"),
    from a prepared corpus' manifest (`bytes_per_token`, measured on that split);
    absent, the bytes tokenizer's text files: 1.0. Bits per byte of a loss on `split`
    are that loss in nats per token / ln 2 / this."""
    if split not in HELD_OUT:
        raise ValueError(f"bytes per token are of a held-out split, not {split!r}")
    value = meta.get("bytes_per_token", {}).get(split, 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"bytes_per_token of {split} must be a positive number, "
                         f"got {value!r}")
    return float(value)


def eval_batches(corpus: Corpus, split: str, tokens: int, block_size: int,
                 batch_size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Evenly spaced windows over the held-out `split` ("validation" for live evaluation
    and tuning, "test" for a benchmark's reported figure): the same ones every run."""
    data = corpus.held_out(split)
    n = max(1, tokens // block_size)
    span = len(data) - block_size - 1
    starts = torch.linspace(0, span, n).long().tolist()
    out = []
    for i in range(0, n, batch_size):
        chunk = starts[i:i + batch_size]
        x = torch.stack([data[s:s + block_size] for s in chunk]).long()
        y = torch.stack([data[s + 1:s + 1 + block_size] for s in chunk]).long()
        out.append((x, y))
    return out
