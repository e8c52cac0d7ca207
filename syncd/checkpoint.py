"""Checkpoints: global parameters, outer optimizer state and the version vector.

Written atomically (a temporary file, fsync, rename, fsync of the folder) as
safetensors, with the versions in the header, so a crash mid-write leaves the
previous checkpoint whole and a reader never sees half a file. Written tensor by
tensor and hashed as it goes (diloco.tensorfile): no second copy of the model is
made in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import torch

from diloco import tensorfile

TOKENIZER = "tokenizer.json"  # the tensor of the run's tokenizer, as UTF-8 bytes


def save(path: Path, params: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor],
         versions: list[int], tokens_merged: int, tokenizer: str | None = None
         ) -> tuple[str, int]:
    """Write a checkpoint; returns its sha256 and size in bytes. `tokenizer`, the run's
    tokenizer.json (None for bytes), goes in as the uint8 tensor TOKENIZER, its sha256 in
    the header."""
    tensors = {f"param.{k}": v for k, v in params.items()}
    tensors.update({f"momentum.{k}": v for k, v in momentum.items()})
    metadata = {"versions": json.dumps(versions), "tokens_merged": str(tokens_merged)}
    if tokenizer is not None:
        raw = tokenizer.encode()
        tensors[TOKENIZER] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        metadata["tokenizer_sha256"] = hashlib.sha256(raw).hexdigest()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    digest = hashlib.sha256()
    with open(tmp, "wb") as f:
        nbytes = tensorfile.write_file(f, tensors, metadata, digest.update)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return digest.hexdigest(), nbytes


def load(path: Path, sha256: str | None = None
         ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[int], int]:
    """Read a checkpoint: (params, momentum, versions, tokens_merged).

    Raises:
        ValueError: when `sha256` is given and the file does not match it.
    """
    path = Path(path)
    body = bytearray(path.stat().st_size)
    with open(path, "rb") as f:
        f.readinto(body)
    if sha256 is not None and hashlib.sha256(body).hexdigest() != sha256:
        raise ValueError(f"checkpoint {path} does not match its sha256")
    try:
        meta, tensors = tensorfile.loads(body)
    except tensorfile.FormatError as exc:
        raise ValueError(f"checkpoint {path} is not a safetensors file: {exc}") from exc
    params = {k.removeprefix("param."): v for k, v in tensors.items() if k.startswith("param.")}
    momentum = {k.removeprefix("momentum."): v for k, v in tensors.items()
                if k.startswith("momentum.")}
    return params, momentum, json.loads(meta["versions"]), int(meta["tokens_merged"])


def load_tokenizer(path: Path, sha256: str | None = None) -> str | None:
    """The tokenizer.json a checkpoint carries; None for one of the bytes tokenizer.

    Raises:
        ValueError: the file does not match `sha256`, is no safetensors file, or its
            tokenizer does not match the sha256 its header names.
    """
    body = Path(path).read_bytes()
    if sha256 is not None and hashlib.sha256(body).hexdigest() != sha256:
        raise ValueError(f"checkpoint {path} does not match its sha256")
    try:
        meta, tensors = tensorfile.loads(bytearray(body))
    except tensorfile.FormatError as exc:
        raise ValueError(f"checkpoint {path} is not a safetensors file: {exc}") from exc
    if TOKENIZER not in tensors:
        return None
    raw = tensors[TOKENIZER].numpy().tobytes()
    if hashlib.sha256(raw).hexdigest() != meta.get("tokenizer_sha256"):
        raise ValueError(f"checkpoint {path}: its tokenizer does not match its sha256")
    return raw.decode()


def initial_params(spec: dict, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The global model a run starts from: the parameters of the checkpoint its spec
    names (a regular file, checked against its sha256, which the spec must give, and
    the model's shapes), else `model`'s own. So a spec names no file syncd reads
    without knowing its digest first (a device, a pipe, another run's secrets).

    Raises:
        ValueError: when the spec gives no sha256 or the checkpoint is not a regular
            file, does not verify or does not fit the model.
    """
    params = {k: v.detach() for k, v in model.state_dict().items()}
    start = spec.get("initial_checkpoint")
    if not start:
        return params
    sha256 = start.get("sha256") if isinstance(start, dict) else None
    if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError("the initial checkpoint has no sha256: syncd reads no file "
                         "without one")
    path = Path(str(start.get("path", "")))
    if not path.is_file():
        raise ValueError(f"the initial checkpoint {str(path)[:200]!r} is not a regular file")
    loaded, _, _, _ = load(path, sha256)
    expected = {k: tuple(v.shape) for k, v in params.items()}
    found = {k: tuple(v.shape) for k, v in loaded.items()}
    if found != expected:
        raise ValueError(f"checkpoint {start['path']} does not fit the run's model: "
                         "its tensors or their shapes differ")
    return {k: loaded[k].float() for k in params}
