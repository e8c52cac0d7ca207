"""Checkpoint files (syncd/checkpoint.py): what is written is read back whole, and a
file that does not verify or does not fit is refused with the reason."""

import hashlib

import pytest
import torch

from syncd import checkpoint

PARAMS = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
MOMENTUM = {"w": torch.full((2, 3), 0.5)}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2, 3))
        self.b = torch.nn.Parameter(torch.zeros(3))


def test_a_checkpoint_reads_back_as_written_and_its_hash_is_the_files(tmp_path):
    path = tmp_path / "run" / "ckpt.safetensors"

    sha256, nbytes = checkpoint.save(path, PARAMS, MOMENTUM, [3, 4], 4096)
    params, momentum, versions, tokens = checkpoint.load(path, sha256)

    assert sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert nbytes == path.stat().st_size
    assert all(torch.equal(params[k], PARAMS[k]) for k in PARAMS)
    assert torch.equal(momentum["w"], MOMENTUM["w"])
    assert (versions, tokens) == ([3, 4], 4096)
    assert not path.with_suffix(".tmp").exists()


def test_a_checkpoint_carries_the_runs_tokenizer_beside_its_tensors(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    text = '{"model": {"type": "BPE", "vocab": {"é": 0}}, "added_tokens": []}'

    sha256, _ = checkpoint.save(path, PARAMS, MOMENTUM, [1], 10, tokenizer=text)

    assert checkpoint.load_tokenizer(path, sha256) == text
    assert checkpoint.load(path, sha256)[0].keys() == PARAMS.keys()
    bytes_run = tmp_path / "bytes.safetensors"
    checkpoint.save(bytes_run, PARAMS, MOMENTUM, [1], 10)
    assert checkpoint.load_tokenizer(bytes_run) is None


def test_a_checkpoint_whose_tokenizer_does_not_match_its_sha256_is_refused(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    checkpoint.save(path, PARAMS, MOMENTUM, [1], 10, tokenizer='{"a": 1}')
    path.write_bytes(path.read_bytes().replace(b'{"a": 1}', b'{"a": 2}'))

    with pytest.raises(ValueError, match="does not match its sha256"):
        checkpoint.load_tokenizer(path)


def test_a_checkpoint_that_does_not_match_its_hash_or_format_is_refused(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    sha256, _ = checkpoint.save(path, PARAMS, {}, [1], 0)

    with pytest.raises(ValueError, match="does not match its sha256"):
        checkpoint.load(path, "0" * 64)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="is not a safetensors file"):
        checkpoint.load(path)
    assert sha256 != hashlib.sha256(b"not a checkpoint").hexdigest()


def test_a_run_starts_from_its_spec_checkpoint_or_else_from_the_model(tmp_path):
    path = tmp_path / "start.safetensors"
    sha256, _ = checkpoint.save(path, PARAMS, {}, [7], 0)

    fresh = checkpoint.initial_params({}, Tiny())
    started = checkpoint.initial_params(
        {"initial_checkpoint": {"path": str(path), "sha256": sha256}}, Tiny())

    assert torch.equal(fresh["w"], torch.zeros(2, 3))
    assert torch.equal(started["w"], PARAMS["w"]) and torch.equal(started["b"], PARAMS["b"])


def test_a_start_checkpoint_of_another_shape_is_refused(tmp_path):
    path = tmp_path / "other.safetensors"
    sha256, _ = checkpoint.save(path, {"w": torch.zeros(4, 4), "b": torch.zeros(3)}, {}, [1], 0)

    with pytest.raises(ValueError, match="does not fit the run's model"):
        checkpoint.initial_params({"initial_checkpoint": {"path": str(path),
                                                          "sha256": sha256}}, Tiny())


@pytest.mark.parametrize("start", [{"path": "{path}"}, {"path": "{path}", "sha256": ""},
                                   {"path": "{path}", "sha256": "x" * 64}, "{path}"])
def test_a_start_checkpoint_without_its_sha256_is_never_read(tmp_path, start):
    path = tmp_path / "start.safetensors"
    checkpoint.save(path, PARAMS, {}, [7], 0)
    named = (start if isinstance(start, str)
             else {k: v.format(path=path) for k, v in start.items()})

    with pytest.raises(ValueError, match="no sha256"):
        checkpoint.initial_params({"initial_checkpoint": named}, Tiny())


def test_a_start_checkpoint_that_is_not_a_regular_file_is_never_read(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        checkpoint.initial_params({"initial_checkpoint": {"path": "/dev/zero",
                                                          "sha256": "0" * 64}}, Tiny())
