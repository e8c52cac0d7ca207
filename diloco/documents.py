"""A corpus' documents, read in one streaming pass: text files, JSON Lines and Parquet.

A text file is one document, read in pieces of about PIECE bytes cut at a line's
end; a JSON Lines file (`.jsonl`) holds a document per line, its text in the field
`data.text_field`; a Parquet file (`.parquet`) a document per row of that column,
read a batch of rows at a time (pyarrow). Nothing holds more than a piece, a line
or a batch in memory. A line that is not JSON, not an object or without a string
in the field, a row whose field is empty, and a text file with a NUL byte (binary)
are skipped and counted (`Skipped`), the rest read. A pass counts the bytes of the
files it has read (`Progress`) and logs them against the corpus' total every
PROGRESS_EVERY_S seconds and at its end: the island's log (and syncd's) shows how far
a long preparation is.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

JSONL_SUFFIXES = {".jsonl"}
PARQUET_SUFFIXES = {".parquet"}
RECORD_SUFFIXES = JSONL_SUFFIXES | PARQUET_SUFFIXES
PIECE = 1 << 20  # characters of a text file handed on at a time
PARQUET_ROWS = 1024  # rows of a Parquet file read at a time
EXAMPLES = 5  # skipped lines named in the report
PROGRESS_EVERY_S = 5.0  # a pass logs its progress at most this often

log = logging.getLogger(__name__)


class Progress:
    """The bytes of a corpus' files one pass (`what`) has read, against their `total`;
    logged (INFO) at most every `every_s` seconds of `clock`, and at `done`."""

    def __init__(self, root: Path | str, what: str, total: int,
                 every_s: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.label = f"corpus {root}: {what}"
        self.total = total
        self.read = 0
        self.every_s = every_s
        self.clock = clock
        self.next_log = clock() + every_s

    def add(self, nbytes: int) -> None:
        self.read += nbytes
        if self.clock() >= self.next_log:
            self.next_log = self.clock() + self.every_s
            self._log()

    def done(self) -> None:
        self.read = max(self.read, self.total)
        self._log()

    def _log(self) -> None:
        log.info("%s: %d of %d bytes read (%.0f%%)", self.label, self.read, self.total,
                 100 * min(self.read / self.total, 1.0) if self.total else 100.0)


@dataclass
class Skipped:
    """What a pass left out: JSON Lines lines by why, binary files, and a few examples."""

    bad_json: int = 0
    no_text: int = 0
    binary_files: int = 0
    examples: list[str] = field(default_factory=list)

    def note(self, where: str, why: str) -> None:
        if len(self.examples) < EXAMPLES:
            self.examples.append(f"{where}: {why}")

    def as_dict(self) -> dict[str, object]:
        return {"bad_json": self.bad_json, "no_text": self.no_text,
                "binary_files": self.binary_files, "examples": self.examples}


@dataclass(frozen=True)
class Piece:
    """Text of one document, in order; `last` on its final piece. `key` names the
    document (its file's relative path, with the line or row of a record) and
    `file_key` its file: the split is drawn from one of them."""

    text: str
    key: str
    file_key: str
    last: bool


def is_record_file(path: Path) -> bool:
    return path.suffix in RECORD_SUFFIXES


def pieces(files: list[tuple[str, Path]], text_field: str, skipped: Skipped,
           progress: Progress | None = None) -> Iterator[Piece]:
    """Every document of `files` ((relative path, path) in order) as pieces; the bytes
    read counted in `progress`, done at the end."""
    counter = progress or Progress("", "", 0, every_s=float("inf"))  # logs nothing
    for rel, path in files:
        if path.suffix in JSONL_SUFFIXES:
            yield from _jsonl(rel, path, text_field, skipped, counter)
        elif path.suffix in PARQUET_SUFFIXES:
            yield from _parquet(rel, path, text_field, skipped)
            counter.add(path.stat().st_size)
        else:
            yield from _text(rel, path, skipped, counter)
    if progress is not None:
        progress.done()


def _text(rel: str, path: Path, skipped: Skipped, progress: Progress) -> Iterator[Piece]:
    with open(path, "rb") as f:
        head = f.read(PIECE)
        if b"\x00" in head:
            skipped.binary_files += 1
            progress.add(path.stat().st_size)
            return
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        buffer = ""
        for line in f:
            buffer += line
            if len(buffer) >= PIECE:
                progress.add(len(buffer.encode()))
                yield Piece(buffer, rel, rel, False)
                buffer = ""
        progress.add(len(buffer.encode()))
        yield Piece(buffer, rel, rel, True)


def _jsonl(rel: str, path: Path, text_field: str, skipped: Skipped,
           progress: Progress) -> Iterator[Piece]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            progress.add(len(line))
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                skipped.bad_json += 1
                skipped.note(f"{rel}:{number}", "not JSON")
                continue
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str) or not text:
                skipped.no_text += 1
                skipped.note(f"{rel}:{number}", f"no text in field {text_field!r}")
                continue
            yield Piece(text, f"{rel}:{number}", rel, True)


def _parquet(rel: str, path: Path, text_field: str, skipped: Skipped) -> Iterator[Piece]:
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as parquet:
        if text_field not in parquet.schema_arrow.names:
            raise ValueError(f"the Parquet file {rel!r} has no column {text_field!r} "
                             f"(data.text_field); it has {parquet.schema_arrow.names}")
        row = 0
        for batch in parquet.iter_batches(batch_size=PARQUET_ROWS, columns=[text_field]):
            for text in batch.column(0).to_pylist():
                row += 1
                if not isinstance(text, str) or not text:
                    skipped.no_text += 1
                    skipped.note(f"{rel}:row {row}", f"no text in column {text_field!r}")
                    continue
                yield Piece(text, f"{rel}:{row}", rel, True)
