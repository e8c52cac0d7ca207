"""Codecs for updates (up) and global fragment differences (down).

DiLoCo's updates tolerate coarse quantization (arXiv 2311.08105 reports
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
from dataclasses import dataclass, field

import torch

from diloco.config import CODECS

BLOCK = 64
QMAX = {"int8": 127, "int4": 7}
# Blocks quantized at a time: 256K values, 1 MiB of float32, so that the temporaries of
# a chunk stay in cache and below the allocator's mmap threshold (syncd/malloc.py).
# Whole tensors at once cost a fresh tensor of the tensor's size per step, each faulted
# in page by page, several times slower at real sizes (bench merge).
CHUNK_BLOCKS = 4096


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
            q, scale = _quantize(t.flatten(), QMAX[codec], pack=codec == "int4")
            out[f"{name}:q"] = q
            out[f"{name}:scale"] = scale
    return out


def decode(payload: dict[str, torch.Tensor], codec: str, shapes: dict[str, tuple[int, ...]]
           ) -> dict[str, torch.Tensor]:
    """Decode a payload into float32 tensors of the expected `shapes`.

    Raises:
        ValueError: when a tensor is missing, extra, or of the wrong dtype or size.
    """
    return {name: t.decode() for name, t in open_payload(payload, codec, shapes).items()}


def open_payload(payload: dict[str, torch.Tensor], codec: str,
                 shapes: dict[str, tuple[int, ...]]) -> dict[str, Encoded]:
    """A payload checked against the expected `shapes`, each tensor as it is on the wire
    (an `Encoded`): decoded only where it is used, a chunk at a time.

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
    out: dict[str, Encoded] = {}
    for name, shape in shapes.items():
        numel = math.prod(shape)
        if codec in ("none", "bf16"):
            t = payload[name]
            _check(name, t, torch.float32 if codec == "none" else torch.bfloat16, numel)
            out[name] = Encoded(tuple(shape), t.reshape(shape))
            continue
        blocks = -(-numel // BLOCK)
        q, scale = payload[f"{name}:q"], payload[f"{name}:scale"]
        if codec == "int4":
            _check(f"{name}:q", q, torch.uint8, blocks * BLOCK // 2)
        else:
            _check(f"{name}:q", q, torch.int8, blocks * BLOCK)
        _check(f"{name}:scale", scale, torch.float32, blocks)
        out[name] = Encoded(tuple(shape), q, scale)
    return out


@dataclass(eq=False)
class Encoded:
    """One tensor of a payload as it came over the wire: `values` (float32 or bfloat16
    in its shape, or a quantized codec's codes) and, when quantized, one `scale` per
    block. What uses it decodes it a chunk of CHUNK_BLOCKS blocks at a time into a
    buffer that stays in cache: a fold reads the codes twice (`norm`, `add_to`) and
    never writes the float32 tensor, which at real sizes costs more than the fold
    (bench merge). A quantized tensor of one chunk or less is decoded whole by `norm`
    and kept for the fold: at a few thousand values, each pass's calls cost more
    than its values."""

    shape: tuple[int, ...]
    values: torch.Tensor
    scale: torch.Tensor | None = None
    _whole: torch.Tensor | None = field(default=None, init=False, repr=False)

    def decode(self) -> torch.Tensor:
        """The float32 tensor, in its shape."""
        if self.scale is None:
            return self.values.float()
        return self._dequantized(self.scale)

    def norm(self) -> float | None:
        """The decoded tensor's norm, None if one of its values is not finite (the
        decode's float32 values: a finite scale whose codes overflow float32 is not).
        A quantized tensor of one chunk is decoded (in cache) and measured; a larger
        one's norm is taken from its codes and scales in float64: each block's squares
        of codes summed (a lookup per pair of bytes), times its scale squared."""
        if self.scale is None:
            return finite_norm(self.values)
        if len(self.scale) <= CHUNK_BLOCKS:
            self._whole = self.decode()
            return finite_norm(self._whole)
        largest = float(self.scale.abs().max())
        if not largest * _LARGEST_CODE[self.values.dtype] <= torch.finfo(torch.float32).max:
            return None  # a NaN scale's comparison is false too
        squares = _SQUARES[self.values.dtype]
        per_block = _block_width(self.values)
        sums = torch.empty(len(self.scale))
        for start in _chunks(len(self.scale)):
            end = min(start + CHUNK_BLOCKS, len(self.scale))
            pairs = self.values[start * per_block:end * per_block].view(torch.int16)
            keys = pairs.int().bitwise_and_(0xFFFF)
            looked_up = torch.index_select(squares, 0, keys)
            sums[start:end] = looked_up.view(end - start, per_block // 2).sum(dim=1)
        return math.sqrt(float(sums.double().mul_(self.scale.double().square()).sum()))

    def add_to(self, out: torch.Tensor, alpha: float) -> None:
        """out += alpha * the decoded tensor (`out` is float32, in its shape)."""
        if self.scale is None or self._whole is not None:
            out.add_(self.values if self._whole is None else self._whole, alpha=alpha)
            return
        flat = out.view(-1)
        rows = torch.empty(min(CHUNK_BLOCKS, len(self.scale)), BLOCK)
        scale = self.scale * alpha
        for start in _chunks(len(scale)):
            end = min(start + CHUNK_BLOCKS, len(scale))
            stop = min(end * BLOCK, len(flat))
            if stop == end * BLOCK:  # whole blocks: the codes' values times alpha's scale
                _codes_chunk(self.values, start, end, rows[:end - start])
                flat[start * BLOCK:stop].view(-1, BLOCK).addcmul_(
                    rows[:end - start], scale[start:end].unsqueeze(1))
            else:  # the last block is cut short
                _dequantize_chunk(self.values, scale, start, end, rows[:end - start])
                flat[start * BLOCK:stop].add_(rows.view(-1)[:stop - start * BLOCK])

    def scaled(self, alpha: float) -> torch.Tensor:
        """alpha * the decoded tensor, a new float32 tensor."""
        if self.scale is None:
            return self.values.mul(alpha) if self.values.dtype == torch.float32 \
                else self.values.float().mul_(alpha)
        if self._whole is not None:
            return self._whole.mul(alpha)
        # alpha in the scales: one pass over the new tensor, not a decode and a product
        return self._dequantized(self.scale * alpha)

    def _dequantized(self, scale: torch.Tensor) -> torch.Tensor:
        """The codes times these per-block scales, float32 in the tensor's shape."""
        return _dequantize(self.values, scale)[:math.prod(self.shape)].view(self.shape)


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


def _chunks(blocks: int) -> range:
    return range(0, blocks, CHUNK_BLOCKS)


def _quantize(flat: torch.Tensor, qmax: int, pack: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (int8, or two int4 nibbles per byte, low first, stored +8 as 1..15) and
    one scale per block, a chunk of CHUNK_BLOCKS blocks at a time."""
    pad = (-len(flat)) % BLOCK
    rows = torch.nn.functional.pad(flat, (0, pad)).view(-1, BLOCK) if pad else flat.view(-1, BLOCK)
    blocks = rows.shape[0]
    scale = torch.empty(blocks, device=flat.device)
    codes = (torch.empty(blocks * BLOCK // 2, dtype=torch.uint8, device=flat.device) if pack
             else torch.empty(blocks * BLOCK, dtype=torch.int8, device=flat.device))
    per_block = BLOCK // 2 if pack else BLOCK
    # A tensor, not a Python number: a GPU divides by a number as a multiplication by its
    # reciprocal, one ulp off the CPU's scales in about half the blocks.
    divisor = torch.tensor(float(qmax), device=flat.device)
    for start in _chunks(blocks):
        chunk = rows[start:start + CHUNK_BLOCKS]
        end = start + len(chunk)
        s = torch.maximum(chunk.amax(dim=1), chunk.amin(dim=1).neg_()).div_(divisor)
        scale[start:end] = s
        safe = torch.where(s > 0, s, torch.ones_like(s))
        q = torch.round(chunk / safe.unsqueeze(1)).clamp_(-qmax, qmax).to(torch.int8)
        out = codes[start * per_block:end * per_block]
        if pack:
            nibbles = q.add_(8).view(torch.uint8).view(-1, 2)  # -7..7 -> 1..15
            torch.bitwise_or(nibbles[:, 0], nibbles[:, 1] << 4, out=out)
        else:
            out.copy_(q.view(-1))
    return codes, scale


# Each byte's two nibbles, low first, as the float32 values they stand for (-8..7), one
# 8-byte pair per byte value, read as int64: one lookup per byte yields both values.
_NIBBLE_PAIRS = (torch.stack([torch.arange(256) & 0x0F, torch.arange(256) >> 4], dim=1)
                 .float().sub_(8.0).view(torch.int64).view(-1))
_NIBBLE_PAIRS_ON: dict[torch.device, torch.Tensor] = {}


def _nibble_pairs(device: torch.device) -> torch.Tensor:
    """_NIBBLE_PAIRS on `device` (an island's GPU decodes what it sends there)."""
    if device.type == "cpu":
        return _NIBBLE_PAIRS
    if device not in _NIBBLE_PAIRS_ON:
        _NIBBLE_PAIRS_ON[device] = _NIBBLE_PAIRS.to(device)
    return _NIBBLE_PAIRS_ON[device]


# Per pair of bytes (read as one 16-bit key), the sum of the squares of the codes they
# hold: four nibbles (-8..7) for packed int4, two values for int8. Float32 is exact for
# them and for their sums over a block (at most 2**20). A lookup per pair of bytes
# takes a quarter less time than one per byte (bench merge).
def _pair_squares(per_byte: torch.Tensor) -> torch.Tensor:
    keys = torch.arange(65536)
    return (per_byte[keys & 0xFF] + per_byte[keys >> 8]).float()


_SQUARES = {
    torch.uint8: _pair_squares((torch.arange(256) & 0x0F).sub(8).square()
                               + (torch.arange(256) >> 4).sub(8).square()),
    torch.int8: _pair_squares(torch.arange(256, dtype=torch.uint8).view(torch.int8).int().square()),
}
_LARGEST_CODE = {torch.uint8: 8, torch.int8: 128}  # in magnitude, keyed by the codes' dtype


def _dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Float32 values of the codes times their block's scale, a chunk of CHUNK_BLOCKS
    blocks at a time (`_dequantize_chunk`)."""
    blocks = len(scale)
    values = torch.empty(blocks * BLOCK, device=codes.device)
    rows = values.view(blocks, BLOCK)
    for start in _chunks(blocks):
        end = min(start + CHUNK_BLOCKS, blocks)
        _dequantize_chunk(codes, scale, start, end, rows[start:end])
    return values


def _dequantize_chunk(codes: torch.Tensor, scale: torch.Tensor, start: int, end: int,
                      out: torch.Tensor) -> None:
    """Blocks start to end of the codes (int8, or packed int4: a lookup of both nibbles
    per byte, which spares masking and shifting into every other float) times their
    scales, into `out` (end - start rows of BLOCK float32 values)."""
    _codes_chunk(codes, start, end, out)
    out.mul_(scale[start:end].unsqueeze(1))


def _codes_chunk(codes: torch.Tensor, start: int, end: int, out: torch.Tensor) -> None:
    """The codes of blocks start to end as float32 values, into `out`."""
    per_block = _block_width(codes)
    chunk = codes[start * per_block:end * per_block]
    if codes.dtype == torch.uint8:
        torch.index_select(_nibble_pairs(codes.device), 0, chunk.int(),
                           out=out.view(-1).view(torch.int64))
    else:
        out.view(-1).copy_(chunk)


def _block_width(codes: torch.Tensor) -> int:
    """Bytes of codes per block: two int4 codes per byte, one int8 code."""
    return BLOCK // 2 if codes.dtype == torch.uint8 else BLOCK


def finite_norm(t: torch.Tensor) -> float | None:
    """The tensor's float32 norm, None if a value is not finite; one pass over it and no
    copy: a float32 norm is finite only if every value is (a NaN or an infinity makes
    it so). Only where it is not (non-finite values, or finite ones whose squares
    overflow float32) is the tensor looked at again, to tell which."""
    norm = float(torch.linalg.vector_norm(t, dtype=torch.float32))
    if math.isfinite(norm):
        return norm
    if not torch.isfinite(t).all():
        return None
    return float(torch.linalg.vector_norm(t, dtype=torch.float64))
