"""The wire format that islands and syncd share.

A message is a safetensors blob followed by its signature. An update (island ->
syncd) ends with a 32-byte tag of the blob: its BLAKE3 hash keyed with the island's
key for its epoch (BLAKE3's keyed mode is a MAC); a global (syncd -> islands) with a
64-byte Ed25519 signature of the blob's BLAKE3 digest under the run's publish key,
which islands can check but not make (diloco.signing). BLAKE3, not SHA-256: every
byte of every message is hashed on both sides, and on one core BLAKE3 hashes
several times faster than SHA-256 does even with the CPU's SHA instructions (bench
signing);
protocol 1 was HMAC-SHA256 and Ed25519 over SHA-256. The key says which kind a
message must be: a global is never read as an update, nor an update as a global. The
metadata travels in the safetensors header as strings. Nothing is ever unpickled:
safetensors holds raw tensor bytes and a JSON header, and the signature is checked
before either is parsed.

A message is built in one buffer, or as pieces that are views of the tensors it
carries (`encode_pieces`, syncd's publish), and read back as views of the buffer
it arrived in (diloco.tensorfile), so a fragment of gigabytes costs its own size
at most once on each side, not three or four times.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import blake3
import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from diloco import tensorfile

PROTOCOL_VERSION = 2
TAG_BYTES = 32  # an update's keyed BLAKE3 tag
KEY_BYTES = 32  # an island key (diloco.signing.island_key), BLAKE3's key size
SIGNATURE_BYTES = 64  # a global's Ed25519 signature
MAX_HEADER_BYTES = 1 << 20
UPDATE_FIELDS = ("run", "island", "epoch", "fragment", "base_version", "seq", "tokens",
                 "inner_steps", "compute_s", "codec")
GLOBAL_FIELDS = ("run", "fragment", "version", "base_version", "codec")


class ProtocolError(ValueError):
    """A message that is not what it claims to be; the reason says why."""


def _header(kind: str, meta: dict[str, Any], key: bytes | Ed25519PrivateKey
            ) -> dict[str, str]:
    required = UPDATE_FIELDS if kind == "update" else GLOBAL_FIELDS
    missing = [f for f in required if f not in meta]
    if kind not in ("update", "global") or missing:
        raise ValueError(f"a {kind!r} message needs {', '.join(required)}; missing {missing}")
    if (kind == "global") != isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"a {kind!r} message is signed with "
                         f"{'the publish key' if kind == 'global' else 'an island key'}")
    if kind == "update":
        _island_key(key)
    return {"protocol": str(PROTOCOL_VERSION), "kind": kind,
            **{k: json.dumps(v) for k, v in meta.items()}}


def encode_message(kind: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor],
                   key: bytes | Ed25519PrivateKey) -> bytearray:
    """Serialize and sign one message: an "update" up to syncd with the island's key
    (its tag), a "global" down to islands with the run's publish key."""
    tail = SIGNATURE_BYTES if kind == "global" else TAG_BYTES
    # Joined, not written into bytearray(n): a joined buffer is not zeroed first, so
    # each byte of the message is written once (a quarter less CPU at 60 MB).
    message = bytearray().join([*tensorfile.pieces(tensors, _header(kind, meta, key)),
                                bytes(tail)])
    view = memoryview(message)
    view[-tail:] = _sign([view[:-tail]], key)
    return message


def encode_pieces(kind: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor],
                  key: bytes | Ed25519PrivateKey) -> list[memoryview]:
    """The message `encode_message` makes, as pieces that are views of the tensors
    (tensorfile.pieces) and its signature last: nothing the size of the tensors is
    copied or allocated. The tensors must not change while the pieces are in use."""
    pieces = tensorfile.pieces(tensors, _header(kind, meta, key))
    return [*pieces, memoryview(_sign(pieces, key))]


def _island_key(key: bytes) -> bytes:
    """The key, once shown to be an island key's size (BLAKE3 takes 32 bytes only)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"an island key is {KEY_BYTES} bytes (diloco.signing.island_key), "
                         f"got {len(key)}")
    return key


def _hash(pieces: list[memoryview], key: bytes | None = None) -> bytes:
    """The BLAKE3 digest of the pieces in order, keyed with `key` (an update's tag)."""
    digest = blake3.blake3() if key is None else blake3.blake3(key=key)
    for piece in pieces:
        digest.update(piece)
    return digest.digest()


def _sign(pieces: list[memoryview], key: bytes | Ed25519PrivateKey) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        return key.sign(_hash(pieces))
    return _hash(pieces, key)


def decode_message(blob: bytes | bytearray, key: bytes | Ed25519PublicKey,
                   max_bytes: int = 1 << 30
                   ) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """Verify and parse a message: (kind, metadata, tensors). An island's key reads an
    update of that island's epoch; the publish key's public half, a global.

    The tensors are views of `blob` when it is a bytearray (what the store reads);
    bytes are copied once first.

    Raises:
        ProtocolError: too large, truncated, badly signed, not safetensors, of
            another protocol version, or not of the kind the key reads.
    """
    expected = "global" if isinstance(key, Ed25519PublicKey) else "update"
    tail = SIGNATURE_BYTES if expected == "global" else TAG_BYTES
    if len(blob) > max_bytes:
        raise ProtocolError(f"message of {len(blob)} bytes exceeds the limit of {max_bytes}")
    if len(blob) < 8 + tail:
        raise ProtocolError(f"message of {len(blob)} bytes is truncated")
    view = memoryview(blob if isinstance(blob, bytearray) else bytearray(blob))
    body, tag = view[:-tail], view[-tail:]
    if isinstance(key, Ed25519PublicKey):
        try:
            key.verify(bytes(tag), _hash([body]))
        except InvalidSignature:
            raise ProtocolError("bad signature: not signed with this run's publish "
                                "key") from None
    elif not hmac.compare_digest(tag, _hash([body], _island_key(key))):
        raise ProtocolError("bad signature: not signed with the key of the island and "
                            "epoch it names")
    try:
        header, tensors = tensorfile.loads(body, MAX_HEADER_BYTES)
    except tensorfile.FormatError as exc:
        raise ProtocolError(f"not a safetensors message: {exc}") from exc
    if header.get("protocol") != str(PROTOCOL_VERSION):
        raise ProtocolError(f"protocol version {header.get('protocol')!r} is not "
                            f"{PROTOCOL_VERSION}")
    kind = header.get("kind")
    required = {"update": UPDATE_FIELDS, "global": GLOBAL_FIELDS}.get(kind)
    if required is None:
        raise ProtocolError(f"unknown message kind {kind!r}")
    if kind != expected:
        raise ProtocolError(f"a {kind!r} message where {expected!r} belongs")
    try:
        meta = {k: json.loads(header[k]) for k in required}
    except (KeyError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"metadata is missing or malformed: {exc}") from exc
    return kind, meta, tensors
