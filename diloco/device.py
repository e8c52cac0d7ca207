"""The device and precision an island trains with, and moving fragments to and from it."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch


def resolve_device(setting: str, local_rank: int = 0) -> str:
    """The device an island process trains on.

    Args:
        setting: train.device of the run config: "auto" (cuda when present), "cpu" or "cuda".
        local_rank: the process's place among its island's processes on this host;
            with cuda it takes GPU number local_rank.

    Raises:
        ValueError: for an unknown setting, or cuda on a host without enough GPUs.
    """
    if setting not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be one of auto, cpu, cuda, got {setting!r}")
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return "cpu"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank >= count:
        raise ValueError(f"island process {local_rank} needs GPU {local_rank}, but this host "
                         f"has {count} GPU(s); use fewer processes or device cpu")
    return f"cuda:{local_rank}"


def autocast(device: str, precision: str) -> AbstractContextManager:
    """The context of a forward pass: bf16 autocast, or nothing for fp32.

    Parameters, gradients and the optimizer stay in float32 either way; the loss
    is computed in float32 (diloco/model.py).
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision != "bf16":
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """A host batch on `device`; to a GPU through pinned memory, without blocking."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class HostStaging:
    """Moves fragments between host memory and the island's device.

    On a GPU every tensor name keeps a pinned host buffer, so copies run by DMA
    and without blocking; one synchronization per fragment, not per tensor. On
    the CPU it only converts.

    Args:
        device: the island's device.
    """

    def __init__(self, device: str):
        self.device = device
        self.pinned = torch.device(device).type == "cuda"
        self.buffers: dict[str, torch.Tensor] = {}
        self.uploaded: torch.cuda.Event | None = None

    def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        buf = self.buffers.get(name)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = self.buffers[name] = torch.empty(like.shape, dtype=like.dtype,
                                                   pin_memory=True)
        return buf

    def to_host(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors on the host, in their dtype: copies the caller keeps (on the CPU,
        the tensors themselves)."""
        if not self.pinned:
            return {n: t.cpu() for n, t in tensors.items()}
        self._wait_for_upload()
        for n, t in tensors.items():
            self._buffer(n, t).copy_(t, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return {n: self.buffers[n].clone() for n in tensors}

    def to_device(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors on the device; later work on the device's stream sees them."""
        if not self.pinned:
            return {n: t.to(self.device) for n, t in tensors.items()}
        self._wait_for_upload()
        out = {}
        for n, t in tensors.items():
            buf = self._buffer(n, t)
            buf.copy_(t)
            out[n] = buf.to(self.device, non_blocking=True)
        self.uploaded = torch.cuda.Event()
        self.uploaded.record(torch.cuda.current_stream(self.device))
        return out

    def _wait_for_upload(self) -> None:
        """The buffers may be rewritten only once the last upload has read them."""
        if self.uploaded is not None:
            self.uploaded.synchronize()
            self.uploaded = None
