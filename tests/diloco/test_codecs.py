import math

import pytest
import torch

from diloco.codecs import (
    BLOCK,
    CHUNK_BLOCKS,
    QMAX,
    decode,
    encode,
    error_bound,
    open_payload,
    payload_nbytes,
)
from diloco.config import CODECS


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "blocks.0.attn.c_attn.weight": torch.randn(32, 96, generator=g) * 0.01,
        "ln_f.bias": torch.randn(3 * BLOCK + 5, generator=g),  # numel not a multiple of BLOCK
        "odd": torch.randn(7, 3, generator=g) * torch.rand(7, 3, generator=g) * 100,
        "zeros": torch.zeros(2, BLOCK + 1),
    }


def round_trip(tensors: dict[str, torch.Tensor], codec: str) -> dict[str, torch.Tensor]:
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    return decode(encode(tensors, codec), codec, shapes)


@pytest.mark.parametrize("codec", CODECS)
def test_the_round_trip_error_of_every_value_is_within_the_codecs_bound(codec):
    tensors = sample_tensors()

    decoded = round_trip(tensors, codec)

    assert decoded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert decoded[name].dtype == torch.float32
        assert decoded[name].shape == t.shape
        assert ((decoded[name] - t).abs() <= error_bound(t, codec)).all(), name


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_the_bound_holds_for_values_at_rounding_ties(codec):
    # Each block has max |x| = qmax * s and values at (k + 0.5) * s: the float
    # error of x / s decides which level they land on, and either is allowed.
    qmax = QMAX[codec]
    scales = torch.linspace(0.01, 3.0, 500)
    ties = (torch.arange(BLOCK - 1) % qmax + 0.5).expand(500, BLOCK - 1)
    t = (torch.cat([torch.full((500, 1), float(qmax)), ties], dim=1) * scales[:, None]).flatten()

    decoded = round_trip({"t": t}, codec)["t"]

    assert ((decoded - t).abs() <= error_bound(t, codec)).all()


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_the_bound_is_half_a_quantization_step_of_the_block(codec):
    t = torch.cat([torch.full((BLOCK,), 2.0), torch.full((BLOCK,), -0.5)])
    half_step = torch.cat([torch.full((BLOCK,), 1.0), torch.full((BLOCK,), 0.25)]) / QMAX[codec]

    assert torch.allclose(error_bound(t, codec), half_step, rtol=1e-3)


@pytest.mark.parametrize("codec", CODECS)
def test_an_all_zero_tensor_comes_back_exactly(codec):
    t = torch.zeros(3, 50)

    assert torch.equal(round_trip({"t": t}, codec)["t"], t)


def test_codec_none_is_exact_and_bf16_is_within_2_to_the_minus_8():
    t = torch.randn(1000, generator=torch.Generator().manual_seed(1))

    assert torch.equal(round_trip({"t": t}, "none")["t"], t)
    bf16 = round_trip({"t": t}, "bf16")["t"]
    assert not torch.equal(bf16, t)
    assert ((bf16 - t).abs() <= t.abs() * 2.0**-8).all()


@pytest.mark.parametrize(("codec", "expected"), [
    ("none", lambda n, blocks: 4 * n),
    ("bf16", lambda n, blocks: 2 * n),
    ("int8", lambda n, blocks: blocks * BLOCK + 4 * blocks),
    ("int4", lambda n, blocks: blocks * BLOCK // 2 + 4 * blocks),
])
def test_the_payload_size_of_each_codec(codec, expected):
    n = 64 * 1000 + 10
    blocks = -(-n // BLOCK)

    nbytes = payload_nbytes(encode({"t": torch.randn(n)}, codec))

    assert nbytes == expected(n, blocks)


def test_int4_is_about_an_eighth_of_fp32_int8_a_quarter_and_bf16_a_half():
    tensors = {"t": torch.randn(64, 1024)}
    fp32 = payload_nbytes(encode(tensors, "none"))

    ratios = {c: payload_nbytes(encode(tensors, c)) / fp32 for c in ("bf16", "int8", "int4")}

    assert ratios["bf16"] == 0.5
    assert ratios["int8"] == pytest.approx(1 / 4 + 1 / BLOCK)  # plus one fp32 scale per block
    assert ratios["int4"] == pytest.approx(1 / 8 + 1 / BLOCK)


def test_a_quantized_payload_holds_codes_and_scales_per_tensor():
    payload = encode({"w": torch.randn(100)}, "int4")

    assert set(payload) == {"w:q", "w:scale"}
    assert payload["w:q"].dtype == torch.uint8
    assert payload["w:scale"].dtype == torch.float32


@pytest.mark.parametrize("codec", CODECS)
def test_decode_rejects_a_missing_tensor(codec):
    payload = encode({"a": torch.ones(4), "b": torch.ones(4)}, codec)

    with pytest.raises(ValueError, match=r"missing \['c"):
        decode(payload, codec, {"a": (4,), "b": (4,), "c": (4,)})


@pytest.mark.parametrize("codec", CODECS)
def test_decode_rejects_an_unexpected_tensor(codec):
    payload = encode({"a": torch.ones(4), "b": torch.ones(4)}, codec)

    with pytest.raises(ValueError, match=r"unexpected \['b"):
        decode(payload, codec, {"a": (4,)})


@pytest.mark.parametrize(("codec", "name", "bad"), [
    ("none", "a", torch.ones(4, dtype=torch.float64)),
    ("none", "a", torch.ones(5)),
    ("bf16", "a", torch.ones(4)),
    ("int8", "a:q", torch.ones(BLOCK, dtype=torch.int16)),
    ("int8", "a:scale", torch.ones(2)),
    ("int4", "a:q", torch.ones(BLOCK, dtype=torch.uint8)),
])
def test_decode_rejects_a_tensor_of_the_wrong_dtype_or_size(codec, name, bad):
    payload = encode({"a": torch.ones(4)}, codec)
    payload[name] = bad

    with pytest.raises(ValueError, match=f"tensor {name} must be"):
        decode(payload, codec, {"a": (4,)})


def test_it_rejects_an_unknown_codec():
    with pytest.raises(ValueError, match="codec must be one of none, bf16, int8, int4, got 'fp8'"):
        encode({"a": torch.ones(4)}, "fp8")
    with pytest.raises(ValueError, match="got 'fp8'"):
        decode({}, "fp8", {})


def test_chunked_quantization_matches_whole_tensor_quantization_across_chunk_edges():
    # More than one chunk of blocks, and a last chunk that is not full.
    numel = CHUNK_BLOCKS * BLOCK * 2 + 3 * BLOCK + 5
    t = torch.randn(numel, generator=torch.Generator().manual_seed(3))
    blocks = torch.nn.functional.pad(t, (0, (-len(t)) % BLOCK)).view(-1, BLOCK)
    scale = blocks.abs().amax(dim=1) / QMAX["int8"]
    codes = torch.round(blocks / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8).flatten()

    payload = encode({"t": t}, "int8")

    assert torch.equal(payload["t:scale"], scale)
    assert torch.equal(payload["t:q"], codes)


def across_chunks() -> dict[str, torch.Tensor]:
    """Tensors of more than one chunk of blocks, a last block that is not full, and zeros."""
    g = torch.Generator().manual_seed(5)
    return {**sample_tensors(),
            "long": torch.randn(CHUNK_BLOCKS * BLOCK * 2 + 3 * BLOCK + 5, generator=g) * 1e-3}


@pytest.mark.parametrize("codec", CODECS)
def test_an_opened_payload_decodes_to_its_decode_and_folds_into_a_sum_as_it(codec):
    tensors = across_chunks()
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    payload = encode(tensors, codec)
    decoded = decode(payload, codec, shapes)

    opened = open_payload(payload, codec, shapes)

    for name, t in opened.items():
        assert torch.equal(t.decode(), decoded[name])
        assert t.norm() == pytest.approx(float(decoded[name].double().norm()), rel=1e-4)
        total = torch.full(shapes[name], 0.25)
        t.add_to(total, 0.5)
        torch.testing.assert_close(total, 0.25 + 0.5 * decoded[name])
        torch.testing.assert_close(t.scaled(-2.0), -2.0 * decoded[name])


@pytest.mark.parametrize("codec", CODECS)
def test_an_opened_tensor_folds_into_a_sum_whether_or_not_its_norm_was_taken(codec):
    tensors = across_chunks()
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    payload = encode(tensors, codec)
    decoded = decode(payload, codec, shapes)

    for name, t in open_payload(payload, codec, shapes).items():
        total = torch.full(shapes[name], 0.25)
        t.add_to(total, 0.5)
        torch.testing.assert_close(total, 0.25 + 0.5 * decoded[name])
        torch.testing.assert_close(t.scaled(3.0), 3.0 * decoded[name])


@pytest.mark.parametrize("codec", ["int8", "int4"])
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, 3e38])
def test_a_quantized_tensor_whose_values_are_not_finite_has_no_norm(codec, scale):
    payload = encode({"t": torch.ones(3 * BLOCK)}, codec)
    payload["t:scale"][1] = scale  # 3e38 is finite, and 7 of it is not in float32

    opened = open_payload(payload, codec, {"t": (3 * BLOCK,)})["t"]

    assert opened.norm() is None
    assert not torch.isfinite(opened.decode()).all()


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_a_quantized_norm_holds_finite_values_whose_squares_overflow_float32(codec):
    t = torch.full((BLOCK,), 1e30)

    opened = open_payload(encode({"t": t}, codec), codec, {"t": (BLOCK,)})["t"]

    assert opened.norm() == pytest.approx(1e30 * math.sqrt(BLOCK), rel=1e-3)


def test_an_int8_norm_counts_the_code_no_encoder_makes():
    payload = encode({"t": torch.ones(BLOCK)}, "int8")
    payload["t:q"][0] = -128  # a hostile message's

    opened = open_payload(payload, "int8", {"t": (BLOCK,)})["t"]

    assert opened.norm() == pytest.approx(float(opened.decode().norm()))
