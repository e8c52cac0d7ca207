"""Codecs for outer gradients (up) and global fragment deltas (down).

DiLoCo's outer gradients tolerate coarse quantization (arXiv 2311.08105 reports
no loss down to 4 bits), which is most of what makes wide-area links enough.
Every codec turns a dict of float tensors into a dict of tensors that
safetensors can store, and back. The receiver already knows the shapes it
expects, so shapes are not sent: decoding checks the payload against them.

- none: float32 as is.
- bf16: bfloat16, relative error at most 2**-8.
- int8, int4: symmetric per-block quantization, one float32 scale per block of
  BLOCK values; the error of a value is at most half a step, max|block| / (2*qmax).
"""

from __future__ import annotations

import math

import torch

CODECS = ("none", "bf16", "int8", "int4")
BLOCK = 64
QMAX = {"int8": 127, "int4": 7}


def encode(tensors: dict[str, torch.Tensor], codec: str) -> dict[str, torch.Tensor]:
    """Encode float tensors for the wire with `codec` (one of CODECS)."""
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        t = t.detach().float().contiguous()
        if codec == "none":
            out[name] = t
        elif codec == "bf16":
            out[name] = t.to(torch.bfloat16)
        else:
            q, scale = _quantize(t.flatten(), QMAX[codec])
            out[f"{name}:q"] = _pack_int4(q) if codec == "int4" else q
            out[f"{name}:scale"] = scale
    return out


def decode(payload: dict[str, torch.Tensor], codec: str, shapes: dict[str, tuple[int, ...]]
           ) -> dict[str, torch.Tensor]:
    """Decode a payload into float32 tensors of the expected `shapes`.

    Raises:
        ValueError: when a tensor is missing, extra, or of the wrong dtype or size.
    """
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    expected = set(_payload_names(shapes, codec))
    if set(payload) != expected:
        missing, extra = sorted(expected - set(payload)), sorted(set(payload) - expected)
        raise ValueError(f"payload tensors do not match the fragment: missing {missing}, "
                         f"unexpected {extra}")
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        numel = math.prod(shape)
        if codec in ("none", "bf16"):
            t = payload[name]
            want = torch.float32 if codec == "none" else torch.bfloat16
            _check(name, t, want, numel)
            out[name] = t.float().reshape(shape)
            continue
        blocks = -(-numel // BLOCK)
        q, scale = payload[f"{name}:q"], payload[f"{name}:scale"]
        if codec == "int4":
            _check(f"{name}:q", q, torch.uint8, -(-blocks * BLOCK // 2))
            values = _unpack_int4_float(q)
        else:
            _check(f"{name}:q", q, torch.int8, blocks * BLOCK)
            values = q.float()
        _check(f"{name}:scale", scale, torch.float32, blocks)
        values = values.view(blocks, BLOCK).mul_(scale.view(blocks, 1)).view(-1)
        out[name] = values[:numel].reshape(shape)
    return out


def error_bound(t: torch.Tensor, codec: str) -> torch.Tensor:
    """The largest round-trip error each element of `t` may have under `codec`."""
    t = t.detach().float()
    if codec == "none":
        return torch.zeros_like(t)
    if codec == "bf16":
        return t.abs() * 2.0**-8
    flat = t.flatten()
    pad = (-len(flat)) % BLOCK
    block_max = torch.nn.functional.pad(flat.abs(), (0, pad)).view(-1, BLOCK).amax(dim=1)
    # Half a step, plus the float32 rounding of the scale, the division and the
    # product (each at most max|block| * 2**-24): a value near a rounding tie can
    # land on the farther level and exceed half a step by those few ulps.
    per_block = block_max / (2 * QMAX[codec]) + block_max * 2.0**-21
    return per_block.repeat_interleave(BLOCK)[:len(flat)].reshape(t.shape)


def payload_nbytes(payload: dict[str, torch.Tensor]) -> int:
    """Bytes of tensor data in a payload (the wire format adds its header)."""
    return sum(t.numel() * t.element_size() for t in payload.values())


def _payload_names(shapes: dict[str, tuple[int, ...]], codec: str) -> list[str]:
    if codec in ("none", "bf16"):
        return list(shapes)
    return [f"{n}:{part}" for n in shapes for part in ("q", "scale")]


def _check(name: str, t: torch.Tensor, dtype: torch.dtype, numel: int) -> None:
    if t.dtype != dtype or t.numel() != numel:
        raise ValueError(f"tensor {name} must be {numel} values of {dtype}, "
                         f"got {t.numel()} of {t.dtype}")


def _quantize(flat: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    pad = (-len(flat)) % BLOCK
    blocks = torch.nn.functional.pad(flat, (0, pad)).view(-1, BLOCK)
    scale = blocks.abs().amax(dim=1) / qmax
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / safe.unsqueeze(1)).clamp_(-qmax, qmax).to(torch.int8)
    return q.flatten(), scale.contiguous()


def _pack_int4(q: torch.Tensor) -> torch.Tensor:
    nibbles = (q.to(torch.int16) + 8).to(torch.uint8)  # -7..7 -> 1..15
    if len(nibbles) % 2:
        nibbles = torch.cat([nibbles, torch.full((1,), 8, dtype=torch.uint8)])
    pairs = nibbles.view(-1, 2)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).contiguous()


# Each byte's two nibbles, low first, as the float32 values they stand for (-8..7), one
# 8-byte pair per byte value, read as int64: one lookup per byte yields both values.
_NIBBLE_PAIRS = (torch.stack([torch.arange(256) & 0x0F, torch.arange(256) >> 4], dim=1)
                 .float().sub_(8.0).view(torch.int64).view(-1))


def _unpack_int4_float(packed: torch.Tensor) -> torch.Tensor:
    """Two nibbles per byte, low first, as float32 values -7..7: a lookup of both per
    byte, 4-5x faster than masking and shifting into every other float (bench merge's
    ingest)."""
    return _NIBBLE_PAIRS.index_select(0, packed.int()).view(torch.float32)
