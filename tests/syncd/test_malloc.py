"""syncd.malloc: freed fragment-sized memory given back at once and a training step's
buffers kept in the heap (glibc's mmap threshold fixed at its 32 MiB ceiling, its
trim threshold high), the heap given back or faulted in on purpose, and nothing done
where there is no mallopt."""

import ctypes
import logging
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from syncd import malloc

GLIBC_ONLY = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")

# In a process of its own (the thresholds are the process's): the minor page faults
# of allocating and touching 64 MiB as 16 tensors of 4 MiB: first, in a steady state,
# after the heap is given back, and after it is faulted in again (two copies: the
# first allocations after a give-back do not all land where the last ones freed).
FAULTS = textwrap.dedent("""
    import json, resource, sys, torch
    from syncd import malloc

    def faults_of(work):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        work()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    malloc.return_large_frees()
    like = [torch.empty(2**20) for _ in range(16)]
    step = lambda: [torch.zeros_like(t) for t in like]
    first = faults_of(step)
    faults_of(step)  # the heap's free chunks settle in the second
    again = faults_of(step)
    malloc.give_back_heap()
    after_give_back = faults_of(step)
    malloc.give_back_heap()
    faults_of(lambda: malloc.fault_in(like, copies=2))
    after_fault_in = faults_of(step)
    print(json.dumps([first, again, after_give_back, after_fault_in]))
""")


@GLIBC_ONLY
def test_on_glibc_both_thresholds_are_fixed():
    assert malloc.return_large_frees() is True


@GLIBC_ONLY
def test_a_steps_freed_buffers_are_reused_without_faults_until_the_heap_is_given_back():
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True,
                         check=True)
    first, again, after_give_back, after_fault_in = (int(n) for n in
                                                     out.stdout.strip()[1:-1].split(","))

    assert first > 1000  # 64 MiB is 16,384 pages of 4 KiB
    assert again < first // 4
    assert after_give_back > first // 2
    assert after_fault_in < first // 4


def test_fault_in_touches_copies_of_the_cpu_tensors_and_skips_the_rest():
    like = [torch.empty(10), torch.empty(3, 4, dtype=torch.float64),
            torch.empty(5, device="meta")]

    assert malloc.fault_in(like, copies=3) == 3 * (10 * 4 + 12 * 8)


def test_a_c_library_without_mallopt_is_left_as_it_is(monkeypatch, caplog):
    class NoMallopt:
        def __init__(self, name):
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)

    with caplog.at_level(logging.INFO, logger="archipelago.malloc"):
        assert malloc.return_large_frees() is False
    assert "has no mallopt" in caplog.text
    assert malloc.give_back_heap() is False


def test_the_threshold_is_glibcs_ceiling_not_its_start():
    assert malloc.THRESHOLD_BYTES == 32 * 2**20
