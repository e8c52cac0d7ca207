"""Checking an update before it may touch a merge.

Everything that arrives over the wire is hostile until shown otherwise. First the
entry is verified (verify_update): its message is signed with the key of the island
and epoch the entry names (diloco.signing.island_key) and its metadata is the stream
entry's; an entry that fails raises Unverified, and
nothing is recorded in the name of the island it names. Then the update is
checked (check_update): the island's epoch, the tensors' names, dtypes and shapes,
finite values, a token count that matches the island's batch, and a norm that is
not absurd next to recent updates of the same fragment. A failed check raises Rejection with a
reason that syncd logs, counts per island and shows; nothing is merged.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from diloco import codecs
from diloco.merge import Update
from diloco.protocol import MAX_HEADER_BYTES, TAG_BYTES, ProtocolError, decode_message
from diloco.signing import island_key
from syncd.bulk import BulkError
from syncd.update_stream import UpdateRef

NORM_FACTOR = 20.0  # an update this many times the recent median norm per step is refused
NORM_WARMUP = 4  # updates seen before the norm bound applies
FULL_PRECISION_CODECS = ("none", "bf16")  # tensors sent whole, in their own shape


class Rejection(ValueError):
    """An island's update that must not be merged; str() is the reason."""


class Unverified(ValueError):
    """A stream entry whose message is not shown to be the update it claims (unreadable,
    not signed with the key of the island and epoch it names, or another's): it speaks
    for no island, and nothing is done in its name. str() is the reason."""


@dataclass(frozen=True)
class IslandFacts:
    """What syncd knows about the sender, to check the update against."""

    epoch: int
    tokens_per_step: int


def verify_update(read: Callable[[int], bytearray], ref: UpdateRef, secret: bytes,
                  max_bytes: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The signed metadata and tensors of the update a stream entry names, once shown to
    be what the entry claims: a message signed with the key of the island and epoch
    the entry names (derived here from the run's secret), whose island, epoch,
    fragment and seq are the entry's. Until then the entry speaks for no one.

    Args:
        read: reads the message the stream entry points to, given the largest size
            accepted; raises syncd.bulk.BulkError when it is too large, expired,
            missing or incomplete.
        ref: the stream entry.
        secret: the run's secret, which the island keys are derived from.
        max_bytes: the largest message accepted.

    Raises:
        Unverified: the message cannot be read, is not signed, or is not the entry's.
    """
    try:
        blob = read(max_bytes)
    except BulkError as exc:
        raise Unverified(f"the update's message: {exc}") from exc
    try:
        _, meta, tensors = decode_message(blob, island_key(secret, ref.island, ref.epoch),
                                          max_bytes)
    except ProtocolError as exc:
        raise Unverified(str(exc)) from exc
    claimed = (meta["island"], meta["epoch"], meta["fragment"], meta["seq"])
    if claimed != (ref.island, ref.epoch, ref.fragment, ref.seq):
        raise Unverified(f"metadata {claimed} does not match the stream entry "
                         f"{(ref.island, ref.epoch, ref.fragment, ref.seq)}")
    return meta, tensors


def check_update(meta: dict[str, Any], tensors: dict[str, torch.Tensor], ref: UpdateRef,
                 facts: IslandFacts, shapes: dict[str, tuple[int, ...]],
                 recent_norms: list[float]) -> tuple[Update, float]:
    """Check a verified update (verify_update's metadata and tensors) against what syncd
    knows; returns it and its norm per inner step.

    Args:
        meta, tensors: the signed message's.
        ref: its stream entry.
        facts: the island's current epoch and tokens per step.
        shapes: the fragment's tensor shapes.
        recent_norms: norms per inner step of recent accepted updates of this fragment.

    Raises:
        Rejection: the island's update must not be merged.
    """
    if ref.epoch < facts.epoch:
        raise Rejection(f"old epoch {ref.epoch}: island {ref.island} is at epoch {facts.epoch}")
    if not isinstance(meta["codec"], str):
        raise Rejection(f"codec must be a name, got {meta['codec']!r}")
    steps, tokens, base = meta["inner_steps"], meta["tokens"], meta["base_version"]
    if not _whole(steps) or not _whole(tokens) or steps < 1:
        raise Rejection(f"inner_steps must be a positive whole number, got {steps!r}")
    if steps > ref.seq:
        # seq is the island's inner step: it cannot have trained more steps than that.
        raise Rejection(f"inner_steps {steps} is more than the island's seq {ref.seq}")
    if not _whole(base) or base < 0:
        raise Rejection(f"base_version must be a whole number of at least 0, got {base!r}")
    if tokens != steps * facts.tokens_per_step:
        raise Rejection(f"{tokens} tokens do not match {steps} inner steps of "
                        f"{facts.tokens_per_step} tokens")
    if meta["codec"] in FULL_PRECISION_CODECS:
        for name, t in tensors.items():
            if name in shapes and tuple(t.shape) != tuple(shapes[name]):
                raise Rejection(f"tensor {name} has shape {tuple(t.shape)}, the fragment's "
                                f"is {tuple(shapes[name])}")
    try:
        delta = codecs.open_payload(tensors, meta["codec"], shapes)
    except ValueError as exc:
        raise Rejection(str(exc)) from exc
    norms = {name: _checked_norm(name, t) for name, t in delta.items()}
    per_step = math.sqrt(sum(n * n for n in norms.values())) / steps
    if len(recent_norms) >= NORM_WARMUP:
        bound = NORM_FACTOR * statistics.median(recent_norms)
        if per_step > bound:
            raise Rejection(f"norm {per_step:.3g} per step exceeds {bound:.3g} "
                            f"({NORM_FACTOR:g}x the recent median)")
    return Update(ref.island, base, tokens, steps, delta, ref.seq, norms), per_step


def _checked_norm(name: str, t: codecs.Encoded) -> float:
    """The tensor's norm (codecs.Encoded.norm), which the fold reuses.

    Raises:
        Rejection: the tensor holds non-finite values.
    """
    if (norm := t.norm()) is None:
        raise Rejection(f"tensor {name} has non-finite values")
    return norm


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every value of these tensors is finite (codecs.finite_norm: one pass over
    each)."""
    return all(codecs.finite_norm(t) is not None for t in tensors)


def message_limit(shapes: dict[str, tuple[int, ...]]) -> int:
    """The largest honest update of a fragment with these tensor shapes: every value in
    float32 (no codec sends more), a full safetensors header, the length and the tag."""
    values = sum(math.prod(shape) for shape in shapes.values())
    return 4 * values + MAX_HEADER_BYTES + 8 + TAG_BYTES


def _whole(value: object) -> bool:
    """A JSON whole number (true and false are not numbers here)."""
    return isinstance(value, int) and not isinstance(value, bool)
