"""The safetensors layout, written and read without extra copies of the tensors.

safetensors.torch.save builds the file in memory from a bytes copy of every
tensor, and safetensors.torch.load copies every tensor out of the bytes it is
given: at 1B parameters each is gigabytes more than the model. The format itself
is simple (an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw bytes), so this module writes
tensors straight into one buffer or file, and reads them as views of the buffer
they arrived in. Files written here are read by safetensors and the other way
round (tests/diloco/test_tensorfile.py).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from typing import BinaryIO

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
BY_NAME = {name: dtype for dtype, name in DTYPES.items()}
MAX_DIM = 2**48  # no dimension of a tensor read is longer (a header's claim is hostile)
MAX_DIMS = 8  # ... and none has more dimensions


class FormatError(ValueError):
    """Bytes that are not a well-formed safetensors file; str() says why."""


def _ordered(tensors: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    # Widest elements first, as safetensors does, so every tensor starts aligned.
    return sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))


def _header(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> bytes:
    entries: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    start = 0
    for name, t in _ordered(tensors):
        if t.dtype not in DTYPES:
            raise ValueError(f"tensor {name} has dtype {t.dtype}, which safetensors cannot hold")
        end = start + t.numel() * t.element_size()
        entries[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                         "data_offsets": [start, end]}
        start = end
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor on the CPU (a view when it can be)."""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def size(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> int:
    """The bytes of the file of these tensors."""
    return 8 + len(_header(tensors, metadata)) + sum(t.numel() * t.element_size()
                                                   for t in tensors.values())


def dumps(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
          ) -> bytearray:
    """The file as one new buffer, the tensors copied in once (`pieces` joined: a
    bytearray joined is not zeroed first, as bytearray(n) is)."""
    return bytearray().join(pieces(tensors, metadata))


def pieces(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
           ) -> list[memoryview]:
    """The file as pieces, in order: its header, then each tensor's bytes (a view of
    the tensor when it is contiguous and on the CPU, so nothing is copied). The
    tensors must not change while the pieces are in use."""
    header = _header(tensors, metadata)
    return [memoryview(struct.pack("<Q", len(header)) + header),
            *(memoryview(_bytes_of(t).numpy()) for _, t in _ordered(tensors))]


def write_file(f: BinaryIO, tensors: dict[str, torch.Tensor],
               metadata: dict[str, str] | None = None,
               observe: Callable[[memoryview], None] | None = None) -> int:
    """Write the file to `f` tensor by tensor (no copy of the whole); `observe` sees
    every piece written (a hash, say). Returns the bytes written."""
    written = 0
    for piece in pieces(tensors, metadata):
        f.write(piece)
        if observe:
            observe(piece)
        written += len(piece)
    return written


def loads(buffer: bytearray | memoryview, max_header: int = 1 << 20
          ) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The metadata and tensors of a file held in `buffer`; the tensors are views of it.

    Raises:
        FormatError: the header is too long, not JSON (or nested too deep to parse), or
            names bytes that are not there.
    """
    view = memoryview(buffer)
    if view.readonly:
        raise ValueError("loads needs a writable buffer (a bytearray): tensors are views of it")
    if len(view) < 8:
        raise FormatError(f"{len(view)} bytes cannot hold a safetensors header")
    (header_len,) = struct.unpack("<Q", view[:8])
    if header_len > min(max_header, len(view) - 8):
        raise FormatError(f"header of {header_len} bytes does not fit the message")
    try:
        header = json.loads(bytes(view[8:8 + header_len]))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise FormatError(f"the header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise FormatError("the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError("the header's __metadata__ is not a map of strings")
    start = 8 + header_len
    data_len = len(view) - start
    spans, tensors = [], {}
    for name, entry in header.items():
        try:
            if not isinstance(entry, dict):
                raise TypeError("not a JSON object")
            dtype = BY_NAME[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
            if any(not 0 <= d <= MAX_DIM for d in shape) or len(shape) > MAX_DIMS:
                raise ValueError(f"a shape of {len(shape)} dimensions up to {max(shape)}")
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # 1e400: Overflow
            raise FormatError(f"tensor {name!r} has a malformed entry: {str(exc)[:200]}"
                              ) from exc
        itemsize = torch.empty(0, dtype=dtype).element_size()
        count = math.prod(shape)
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_len \
                or end - begin != count * itemsize:
            raise FormatError(f"tensor {name!r} claims bytes {begin}..{end} for shape {shape} "
                              f"of {entry['dtype']}, in {data_len} bytes of data")
        spans.append((begin, end))
        tensors[name] = (torch.frombuffer(view, dtype=dtype, count=count, offset=start + begin)
                         .view(shape) if count else torch.empty(shape, dtype=dtype))
    spans.sort()
    covered = 0
    for begin, end in spans:
        if begin != covered:
            raise FormatError(f"the data has a gap or an overlap at byte {covered}")
        covered = end
    if covered != data_len:
        raise FormatError(f"the tensors cover {covered} of {data_len} bytes of data")
    return metadata, tensors
