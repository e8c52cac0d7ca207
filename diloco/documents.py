"""A corpus' documents, read in one streaming pass: text files, JSON Lines and Parquet.

A text file is one document, read in pieces of about PIECE bytes cut at a line's
end; a JSON Lines file (`.jsonl`) holds a document per line, its text in the field
`data.text_field`; a Parquet file (`.parquet`) a document per row of that column,
read a batch of rows at a time (pyarrow). Nothing holds more than a piece, a line
or a batch in memory. A line that is not JSON, not an object or without a string
in the field, a row whose field is empty, and a text file with a NUL byte (binary)
are skipped and counted (`Skipped`), the rest read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

JSONL_SUFFIXES = {".jsonl"}
PARQUET_SUFFIXES = {".parquet"}
RECORD_SUFFIXES = JSONL_SUFFIXES | PARQUET_SUFFIXES
PIECE = 1 << 20  # characters of a text file handed on at a time
PARQUET_ROWS = 1024  # rows of a Parquet file read at a time
EXAMPLES = 5  # skipped lines named in the report


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


def pieces(files: list[tuple[str, Path]], text_field: str, skipped: Skipped
           ) -> Iterator[Piece]:
    """Every document of `files` ((relative path, path) in order) as pieces."""
    for rel, path in files:
        if path.suffix in JSONL_SUFFIXES:
            yield from _jsonl(rel, path, text_field, skipped)
        elif path.suffix in PARQUET_SUFFIXES:
            yield from _parquet(rel, path, text_field, skipped)
        else:
            yield from _text(rel, path, skipped)


def _text(rel: str, path: Path, skipped: Skipped) -> Iterator[Piece]:
    with open(path, "rb") as f:
        head = f.read(PIECE)
        if b"\x00" in head:
            skipped.binary_files += 1
            return
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        buffer = ""
        for line in f:
            buffer += line
            if len(buffer) >= PIECE:
                yield Piece(buffer, rel, rel, False)
                buffer = ""
        yield Piece(buffer, rel, rel, True)


def _jsonl(rel: str, path: Path, text_field: str, skipped: Skipped) -> Iterator[Piece]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
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
