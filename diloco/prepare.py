"""Preparing a corpus as token ids: documents (diloco/documents.py) read in one
streaming pass, tokenized (diloco/tokenizer.py) a batch at a time and appended to
their split's file, each document followed by the tokenizer's EOS.

Used for every corpus but one of text files under the bytes tokenizer, which
diloco/data.py copies byte for byte as before. Each document goes to the split that
a hash of its key draws (split_of: a text file's relative path, a record's path and
line or row), so held-out text is whole documents; a held-out split left empty
(one text file, too few documents) takes its share of the ids from the end of train,
and its text bytes are measured by decoding those ids.
A `train` tokenizer is trained first, on the train split's documents (one more
pass), and written beside the splits. Memory holds one batch of text and its ids.
"""

from __future__ import annotations

import contextlib
import logging
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from diloco import tokenizer as tokenizers
from diloco.documents import Piece, Progress, Skipped, is_record_file, pieces

HELD_OUT = ("validation", "test")
SPLITS = ("train", *HELD_OUT)
CHUNK = 8 * 1024 * 1024  # bytes read or copied at a time while preparing
BATCH_CHARS = 1 << 20  # characters of text tokenized at once
MIN_TRAIN, MIN_HELD_OUT = 1024, 256  # tokens (bytes, for the bytes tokenizer)
DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """What is prepared: the corpus' root and its files, the split shares, the field of
    a record's text and the tokenizer's kind (data.tokenizer) and size (data.vocab_size);
    and who `watch`es it, handed each pass's Progress as the pass begins (syncd's
    status of the corpus reads it)."""

    root: Path
    files: list[tuple[str, Path]]
    eval_fraction: float
    text_field: str
    tokenizer: str
    vocab_size: int
    watch: Callable[[Progress], None] | None = field(default=None, compare=False)

    def progress(self, what: str, skipped: Skipped) -> Progress:
        """A pass's Progress over every file's bytes, shown to the watcher."""
        made = Progress(self.root, what, sum(path.stat().st_size for _, path in self.files),
                        skipped=skipped)
        if self.watch is not None:
            self.watch(made)
        return made


def split_of(rel: str, eval_fraction: float) -> str:
    """The split of the document at key `rel`, by a hash of it: validation for a hash
    in the first eval_fraction (the files format 1 held out as eval, which earlier
    tuning read), test for the next eval_fraction (files that were train then, so
    never evaluated on), train for the rest."""
    bucket = zlib.crc32(rel.encode()) % 1000
    if bucket < eval_fraction * 1000:
        return "validation"
    return "test" if bucket < 2 * eval_fraction * 1000 else "train"


def move_tail(source: BinaryIO, dest: BinaryIO, cut: int) -> None:
    """Move the bytes of `source` from `cut` on to the end of `dest`."""
    end = source.tell()
    source.seek(cut)
    while chunk := source.read(min(CHUNK, end - source.tell())):
        dest.write(chunk)
    source.seek(cut)
    source.truncate()


def make_tokenizer(source: Source) -> tokenizers.Tokenizer:
    """The run's tokenizer; a `train` one trained here on the train split's documents."""
    if source.tokenizer == tokenizers.BYTES:
        return tokenizers.Tokenizer()
    if source.tokenizer != tokenizers.TRAIN:
        return tokenizers.from_folder(source.tokenizer)
    texts = (piece.text for piece, split in _routed(source, Skipped(), "training the tokenizer")
             if split == "train")
    return tokenizers.train_bpe(texts, source.vocab_size)


def _routed(source: Source, skipped: Skipped, what: str) -> Iterator[Any]:
    """(piece, split) of every document piece, in order; the pass (`what`) logs how
    many of the files' bytes it has read."""
    one_text_file = source.root.is_file() and not is_record_file(source.root)
    progress = source.progress(what, skipped)
    for piece in pieces(source.files, source.text_field, skipped, progress):
        yield piece, "train" if one_text_file else split_of(piece.key, source.eval_fraction)


def write_splits(source: Source, tokenizer: tokenizers.Tokenizer,
                 out: dict[str, BinaryIO]) -> dict[str, Any]:
    """Tokenize every document into its split's file; the manifest's facts of it."""
    skipped = Skipped()
    dtype = DTYPES[tokenizer.dtype_bytes()]
    text_bytes = dict.fromkeys(SPLITS, 0)
    pending: dict[str, list[Piece]] = {s: [] for s in SPLITS}
    chars = dict.fromkeys(SPLITS, 0)
    for piece, split in _routed(source, skipped, "tokenizing"):
        pending[split].append(piece)
        chars[split] += len(piece.text)
        text_bytes[split] += len(piece.text.encode())
        if chars[split] >= BATCH_CHARS:
            _flush(pending[split], tokenizer, dtype, out[split])
            chars[split] = 0
    for split in SPLITS:
        _flush(pending[split], tokenizer, dtype, out[split])
    width = dtype().itemsize
    _fill_held_out(out, text_bytes, tokenizer, dtype, source.eval_fraction)
    tokens = {s: f.tell() // width for s, f in out.items()}
    if tokens["train"] < MIN_TRAIN or min(tokens[s] for s in HELD_OUT) < MIN_HELD_OUT:
        raise ValueError(f"corpus at {str(source.root)!r} is too small: " + ", ".join(
            f"{tokens[s]} {s}" for s in SPLITS) + " tokens")
    if skipped.bad_json or skipped.no_text:
        log.warning("corpus %s: skipped %d lines that are not JSON and %d without text in "
                    "%r (%s)", source.root, skipped.bad_json, skipped.no_text,
                    source.text_field, "; ".join(skipped.examples))
    return {"dtype": np.dtype(dtype).name, "tokens": tokens, "text_bytes": text_bytes,
            "bytes_per_token": {s: text_bytes[s] / tokens[s] for s in HELD_OUT},
            "skipped_records": skipped.as_dict()}


def _flush(batch: list[Piece], tokenizer: tokenizers.Tokenizer, dtype: Any,
           out: BinaryIO) -> None:
    """Append the batch's ids to `out`, the EOS after each document's last piece."""
    if not batch:
        return
    ids = tokenizer.encode([p.text for p in batch])
    parts = []
    for piece, made in zip(batch, ids, strict=True):
        parts.append(np.asarray(made, dtype=dtype))
        if piece.last and tokenizer.eos is not None:
            parts.append(np.asarray([tokenizer.eos], dtype=dtype))
    out.write(np.concatenate(parts).tobytes())
    batch.clear()


def _fill_held_out(out: dict[str, BinaryIO], text_bytes: dict[str, int],
                   tokenizer: tokenizers.Tokenizer, dtype: Any, eval_fraction: float) -> None:
    """A held-out split left empty takes eval_fraction of train's ids from its end (as
    diloco/data.py does with bytes); its text bytes are measured on those ids."""
    width = np.dtype(dtype).itemsize
    share = int(out["train"].tell() // width * eval_fraction)
    for split in HELD_OUT:
        if out[split].tell() == 0 and share:
            move_tail(out["train"], out[split], out["train"].tell() - share * width)
            moved = text_bytes_of(out[split], tokenizer, dtype)
            text_bytes[split] += moved
            text_bytes["train"] -= moved


def text_bytes_of(ids_file: BinaryIO, tokenizer: tokenizers.Tokenizer, dtype: Any) -> int:
    """The UTF-8 bytes of the text the ids in `ids_file` decode to, EOS left out, read
    CHUNK bytes at a time (a character split between two reads counts as the
    replacement character's bytes: a few bytes per CHUNK at most)."""
    ids_file.seek(0)
    total = 0
    while block := ids_file.read(CHUNK):
        ids = np.frombuffer(block, dtype=dtype)
        if tokenizer.eos is not None:
            ids = ids[ids != tokenizer.eos]
        total += len(tokenizer.decode(ids.tolist()).encode())
    return total


def prepare_tokens(source: Source, folder: Path, temps: dict[str, Path]) -> dict[str, Any]:
    """Write the splits of `source` as token ids to `temps` and the tokenizer beside
    them in `folder`; the manifest's facts of the ids and the tokenizer."""
    tokenizer = make_tokenizer(source)
    with contextlib.ExitStack() as stack:
        out = {s: stack.enter_context(open(temps[s], "w+b")) for s in SPLITS}
        facts = write_splits(source, tokenizer, out)
        for f in out.values():
            f.flush()
            os.fsync(f.fileno())
    facts["tokenizer"] = {"kind": source.tokenizer if source.tokenizer in (
        tokenizers.BYTES, tokenizers.TRAIN) else "folder", "sha256": tokenizer.sha256,
        "vocab_size": tokenizer.vocab_size, "eos": tokenizer.eos}
    if tokenizer.json_text is not None:
        temp = folder / f".{tokenizers.TOKENIZER_FILE}.tmp"
        temp.write_text(tokenizer.json_text)
        temp.replace(folder / tokenizers.TOKENIZER_FILE)
        facts["tokenizer"]["file"] = tokenizers.TOKENIZER_FILE
    return facts
