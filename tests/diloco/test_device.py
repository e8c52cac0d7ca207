"""The device an island trains on, its precision, and fragments moved to and from it."""

import pytest
import torch

from diloco.device import HostStaging, autocast, resolve_device


def test_the_device_is_cpu_without_a_gpu_unless_cuda_is_asked_for(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="needs GPU 0, but this host has 0 GPU"):
        resolve_device("cuda")


def test_the_device_is_the_gpu_of_the_processs_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    assert resolve_device("auto") == "cuda:0"
    assert resolve_device("cuda", local_rank=1) == "cuda:1"
    assert resolve_device("cpu", local_rank=1) == "cpu"
    with pytest.raises(ValueError, match="island process 2 needs GPU 2, but this host has 2"):
        resolve_device("auto", local_rank=2)
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, got 'tpu'"):
        resolve_device("tpu")


def test_fp32_runs_without_autocast():
    with autocast("cpu", "fp32"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("cpu", "bf16"):
        assert torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="precision must be fp32 or bf16, got 'fp16'"):
        autocast("cpu", "fp16")


def test_host_staging_on_the_cpu_hands_the_tensors_over_as_they_are():
    staging = HostStaging("cpu")
    codes = torch.arange(4, dtype=torch.uint8)
    w = torch.arange(4.0)

    host = staging.to_host({"w:q": codes, "w": w})

    assert host["w:q"] is codes and host["w"] is w  # an encoded update's own tensors
    assert staging.to_device({"w": w})["w"] is w
    assert not staging.buffers
