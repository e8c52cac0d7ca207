"""The wire format that islands and syncd share.

A message is a safetensors blob followed by a 32-byte HMAC-SHA256 tag of that
blob under the run's secret. The metadata travels in the safetensors header as
strings. Nothing is ever unpickled: safetensors holds raw tensor bytes and a
JSON header, and the tag is checked before either is parsed.

A message is built in one buffer and read back as views of the buffer it arrived
in (diloco.tensorfile), so a fragment of gigabytes costs its own size once on
each side, not three or four times.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import torch

from diloco import tensorfile

PROTOCOL_VERSION = 1
TAG_BYTES = 32
MAX_HEADER_BYTES = 1 << 20
UPDATE_FIELDS = ("run", "island", "epoch", "fragment", "base_version", "seq", "tokens",
                 "inner_steps", "compute_s", "codec")
GLOBAL_FIELDS = ("run", "fragment", "version", "base_version", "codec")


class ProtocolError(ValueError):
    """A message that is not what it claims to be; the reason says why."""


def encode_message(kind: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor],
                   secret: bytes) -> bytearray:
    """Serialize and sign one message ("update" up to syncd, "global" down to islands)."""
    required = UPDATE_FIELDS if kind == "update" else GLOBAL_FIELDS
    missing = [f for f in required if f not in meta]
    if kind not in ("update", "global") or missing:
        raise ValueError(f"a {kind!r} message needs {', '.join(required)}; missing {missing}")
    header = {"protocol": str(PROTOCOL_VERSION), "kind": kind,
              **{k: json.dumps(v) for k, v in meta.items()}}
    length = tensorfile.size(tensors, header)
    message = bytearray(length + TAG_BYTES)
    view = memoryview(message)
    tensorfile.write_into(view[:length], tensors, header)
    view[length:] = hmac.new(secret, view[:length], hashlib.sha256).digest()
    return message


def decode_message(blob: bytes | bytearray, secret: bytes, max_bytes: int = 1 << 30
                   ) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """Verify and parse a message: (kind, metadata, tensors).

    The tensors are views of `blob` when it is a bytearray (what the store reads);
    bytes are copied once first.

    Raises:
        ProtocolError: too large, truncated, badly signed, not safetensors, or of
            another protocol version.
    """
    if len(blob) > max_bytes:
        raise ProtocolError(f"message of {len(blob)} bytes exceeds the limit of {max_bytes}")
    if len(blob) < 8 + TAG_BYTES:
        raise ProtocolError(f"message of {len(blob)} bytes is truncated")
    view = memoryview(blob if isinstance(blob, bytearray) else bytearray(blob))
    body, tag = view[:-TAG_BYTES], view[-TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(secret, body, hashlib.sha256).digest()):
        raise ProtocolError("bad signature: not signed with this run's secret")
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
    try:
        meta = {k: json.loads(header[k]) for k in required}
    except (KeyError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"metadata is missing or malformed: {exc}") from exc
    return kind, meta, tensors
