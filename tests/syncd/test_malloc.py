"""Freed fragment-sized memory given back at once (syncd.malloc): glibc's mmap
threshold fixed at its 32 MiB ceiling, and nothing done where there is no mallopt."""

import ctypes
import logging
import platform

import pytest

from syncd import malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_on_glibc_the_mmap_threshold_is_fixed():
    assert malloc.return_large_frees() is True


def test_a_c_library_without_mallopt_is_left_as_it_is(monkeypatch, caplog):
    def no_library(name):
        raise OSError(f"no {name}")

    monkeypatch.setattr(ctypes, "CDLL", no_library)

    with caplog.at_level(logging.INFO, logger="archipelago.malloc"):
        assert malloc.return_large_frees() is False
    assert "has no mallopt" in caplog.text


def test_the_threshold_is_glibcs_ceiling_not_its_start():
    assert malloc.THRESHOLD_BYTES == 32 * 2**20
