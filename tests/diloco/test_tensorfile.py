"""The safetensors layout written and read without copies, against the library itself."""

import hashlib
import io
import struct

import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from diloco import tensorfile

TENSORS = {"w": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int8),
           "h": torch.randn(4).to(torch.bfloat16), "empty": torch.zeros(0, 2)}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and torch.equal(a[n], b[n]) for n in a)


def test_what_it_writes_safetensors_reads_and_the_other_way_round():
    ours = tensorfile.dumps(TENSORS, {"note": "x"})
    assert same(safetensors_load(bytes(ours)), TENSORS)

    metadata, theirs = tensorfile.loads(bytearray(safetensors_save(TENSORS, {"note": "y"})))
    assert same(theirs, TENSORS) and metadata == {"note": "y"}


def test_the_tensors_it_reads_are_views_of_the_buffer_they_arrived_in():
    buffer = tensorfile.dumps({"w": torch.zeros(4)})
    _, tensors = tensorfile.loads(buffer)

    buffer[-4:] = struct.pack("<f", 2.5)

    assert tensors["w"][-1].item() == 2.5


def test_a_file_written_tensor_by_tensor_is_the_same_bytes_and_hashes_as_it_goes():
    digest = hashlib.sha256()
    out = io.BytesIO()

    written = tensorfile.write_file(out, TENSORS, {"note": "x"}, digest.update)

    assert out.getvalue() == bytes(tensorfile.dumps(TENSORS, {"note": "x"}))
    assert written == len(out.getvalue())
    assert digest.hexdigest() == hashlib.sha256(out.getvalue()).hexdigest()


def with_header(header: bytes, data: bytes) -> bytearray:
    return bytearray(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize("raw, reason", [
    (with_header(b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b"\0" * 4),
     "claims bytes"),
    (with_header(b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8),
     "gap or an overlap"),
    (with_header(b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 8),
     "cover 4 of 8"),
    (with_header(b'{"w":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
     "malformed"),
    (with_header(b'{"__metadata__":{"a":1}}', b""), "map of strings"),
    (with_header(b"not json", b""), "not JSON"),
    (with_header(b"[" * 200_000, b""), "not JSON"),  # nested too deep to parse
    (with_header(b'{"w":' * 200_000, b""), "not JSON"),
    (bytearray(struct.pack("<Q", 1 << 40)), "does not fit"),
])
def test_bytes_that_are_not_a_well_formed_file_are_refused_with_the_reason(raw, reason):
    with pytest.raises(tensorfile.FormatError, match=reason):
        tensorfile.loads(raw)
