"""Byte-level text corpora, split into train and eval, and one shard per island.

The default corpus is real text that every machine with Python has: the
standard library's own sources, read in sorted path order so that two machines
with the same Python see the same bytes. A run may name its own text file or
folder instead.
"""

from __future__ import annotations

import functools
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

# Enough text for every benchmark here, small enough to load in about a second.
DEFAULT_CORPUS_BYTES = 16 * 1024 * 1024
TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".json", ".csv", ".html", ".c", ".h", ""}


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # uint8, 1-D
    eval: torch.Tensor  # uint8, 1-D
    source: str


def default_corpus_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _text_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ValueError(f"data.path {str(root)!r} is neither a file nor a folder")
    files = [p for p in root.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
             and "site-packages" not in p.parts and "__pycache__" not in p.parts]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4)
def load_corpus(path: str = "", eval_fraction: float = 0.05,
                max_bytes: int = DEFAULT_CORPUS_BYTES) -> Corpus:
    """Read a corpus and split it by file into train and eval.

    Args:
        path: a text file or a folder of text files; empty for the default corpus.
        eval_fraction: share of files (chosen by a hash of their path) held out.
        max_bytes: stop reading once this many bytes are in.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    root = Path(path) if path else default_corpus_root()
    train, held_out = bytearray(), bytearray()
    total = 0
    for file in _text_files(root):
        data = file.read_bytes()
        if b"\x00" in data:  # a binary file, not text
            continue
        rel = file.relative_to(root).as_posix() if root.is_dir() else file.name
        is_eval = zlib.crc32(rel.encode()) % 1000 < eval_fraction * 1000
        (held_out if is_eval else train).extend(data)
        total += len(data)
        if total >= max_bytes:
            break
    if root.is_file() or not held_out:
        # One file, or too few files to hold some out: split the bytes instead.
        joined = train + held_out
        cut = int(len(joined) * (1 - eval_fraction))
        train, held_out = joined[:cut], joined[cut:]
    if len(train) < 1024 or len(held_out) < 256:
        raise ValueError(f"corpus at {str(root)!r} is too small: "
                         f"{len(train)} train and {len(held_out)} eval bytes")
    as_tensor = functools.partial(torch.frombuffer, dtype=torch.uint8)
    return Corpus(train=as_tensor(bytearray(train)).clone(),
                  eval=as_tensor(bytearray(held_out)).clone(), source=str(root))


class ShardSampler:
    """Random training windows from one island's disjoint shard of the train split."""

    def __init__(self, corpus: Corpus, shard: int, num_shards: int, block_size: int, seed: int):
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard must be between 0 and {num_shards - 1}, got {shard}")
        size = len(corpus.train) // num_shards
        if size <= block_size + 1:
            raise ValueError(f"each of {num_shards} shards has {size} bytes, "
                             f"fewer than block_size + 2 ({block_size + 2})")
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
