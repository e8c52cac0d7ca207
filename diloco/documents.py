"""A corpus' documents, read in one streaming pass: text files, JSON Lines and Parquet.

A text file is one document, read in pieces of about PIECE bytes cut at a line's
end; a JSON Lines file (`.jsonl`) holds a document per line, its text in the field
`data.text_field`; a Parquet file (`.parquet`) a document per row of that column,
read a batch of rows at a time (pyarrow). Nothing holds more than a piece, a line
or a batch in memory. A line that is not JSON, not an object or without a string
in the field, a row whose field is empty, and a text file with a NUL byte (binary)
are skipped and counted (`Skipped`), the rest read. A pass counts the bytes of the
files it has read and the documents it has handed on (`Progress`) and logs them
against the corpus' total, with a bar, every PROGRESS_EVERY_S seconds and at its end:
the island's log (and syncd's) shows how far a long preparation is, and syncd's
status (syncd/corpus.py) reads the same counts for the run page's bar.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JSONL_SUFFIXES = {".jsonl"}
PARQUET_SUFFIXES = {".parquet"}
RECORD_SUFFIXES = JSONL_SUFFIXES | PARQUET_SUFFIXES
PIECE = 1 << 20  # characters of a text file handed on at a time
PARQUET_ROWS = 1024  # rows of a Parquet file read at a time
EXAMPLES = 5  # skipped lines named in the report
PROGRESS_EVERY_S = 5.0  # a pass logs its progress at most this often
BAR_WIDTH = 20  # characters of the log's progress bar

log = logging.getLogger(__name__)


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """A text progress bar of `fraction` (clipped to 0..1): [#####---------------]."""
    filled = round(width * min(max(fraction, 0.0), 1.0))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class Progress:
    """The bytes of a corpus' files one pass (`what`) has read, against their `total`,
    the documents it has handed on, and the records its `skipped` counts; logged
    (INFO) at most every `every_s` seconds of `clock`, and at `done`."""

    def __init__(self, root: Path | str, what: str, total: int,
                 every_s: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic,
                 skipped: Skipped | None = None):
        self.label = f"corpus {root}: {what}"
        self.what = what
        self.total = total
        self.read = 0
        self.documents = 0
        self.skipped = skipped if skipped is not None else Skipped()
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

    @property
    def fraction(self) -> float:
        return min(self.read / self.total, 1.0) if self.total else 1.0

    def snapshot(self) -> dict[str, Any]:
        """The pass and its counts now: what syncd's status of the corpus shows."""
        return {"stage": self.what, "bytes_read": min(self.read, self.total),
                "bytes_total": self.total, "documents": self.documents,
                "skipped": self.skipped.total}

    def _log(self) -> None:
        log.info("%s: %s %d of %d bytes read (%.0f%%), %d documents, %d skipped",
                 self.label, bar(self.fraction), self.read, self.total, 100 * self.fraction,
                 self.documents, self.skipped.total)


@dataclass
class Skipped:
    """What a pass left out: JSON Lines lines by why, binary files, and a few examples."""

    bad_json: int = 0
    no_text: int = 0
    binary_files: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.bad_json + self.no_text + self.binary_files

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
    read and the documents counted in `progress`, done at the end."""
    counter = progress or Progress("", "", 0, every_s=float("inf"))  # logs nothing
    for rel, path in files:
        if path.suffix in JSONL_SUFFIXES:
            found = _jsonl(rel, path, text_field, skipped, counter)
        elif path.suffix in PARQUET_SUFFIXES:
            found = _parquet(rel, path, text_field, skipped)
        else:
            found = _text(rel, path, skipped, counter)
        for piece in found:
            counter.documents += piece.last
            yield piece
        if path.suffix in PARQUET_SUFFIXES:
            counter.add(path.stat().st_size)
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
