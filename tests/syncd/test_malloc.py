"""syncd.malloc: freed fragment-sized memory given back at once (glibc's mmap threshold
fixed at its 32 MiB ceiling) and, in a process that trains, a step's buffers kept in
the heap (its trim threshold high) and every thread's in one arena, the heap given
back or faulted in on purpose, and nothing done where there is no mallopt."""

import ctypes
import json
import logging
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from syncd import malloc

GLIBC_ONLY = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")

# In a process of its own (the thresholds are the process's): the minor page faults of
# a small GPT's training steps, as an island steps (AdamW, the gradients set to None
# after each): its first, four in a steady state, the first of a fresh optimizer
# after the heap is given back, and the same after it is faulted in again.
FAULTS = textwrap.dedent("""
    import json, resource, sys, torch
    from diloco.model import GPT, GPTConfig
    from syncd import malloc

    malloc.return_large_frees(keep_heap=sys.argv[1] == "keep")
    torch.set_num_threads(1)
    model = GPT(GPTConfig(n_layer=2, n_embd=256, n_head=4, block_size=64))
    x = torch.zeros(2, 64, dtype=torch.long)

    def faults_of(work):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        work()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    def stepper():
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        def step():
            _, loss = model(x, x)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step

    step = stepper()
    first = faults_of(step)
    faults_of(step)  # the heap's free chunks settle in the second
    steady = sum(faults_of(step) for _ in range(4))
    del step
    malloc.give_back_heap()
    after_give_back = faults_of(stepper())
    malloc.give_back_heap()
    malloc.fault_in(model.parameters(), copies=3)
    after_fault_in = faults_of(stepper())
    print(json.dumps([first, steady, after_give_back, after_fault_in]))
""")


# In a process of its own: a thread allocates and frees a tensor below the mmap
# threshold, then glibc's malloc_stats lists the process's arenas (on stderr).
THREAD_ARENAS = textwrap.dedent("""
    import ctypes, ctypes.util, sys, threading, torch
    from syncd import malloc

    malloc.return_large_frees(keep_heap=sys.argv[1] == "keep")
    thread = threading.Thread(target=lambda: torch.ones(2 * 1024 * 1024))
    thread.start()
    thread.join()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_stats()
""")


def faults(heap: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", FAULTS, heap], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


@GLIBC_ONLY
def test_on_glibc_the_thresholds_are_fixed():
    assert malloc.return_large_frees() is True
    assert malloc.return_large_frees(keep_heap=True) is True


@GLIBC_ONLY
def test_with_keep_heap_a_steps_buffers_are_reused_without_faults_until_given_back():
    first, steady, after_give_back, after_fault_in = faults("keep")

    assert first > 1000  # the gradients, moments and activations of a first step
    assert steady < first // 4  # four steps after it
    assert after_give_back > first // 2
    assert after_fault_in < after_give_back // 2  # the activations are not faulted in


@GLIBC_ONLY
def test_without_keep_heap_every_step_faults_its_buffers_in_again():
    first, steady, _, _ = faults("give back")

    assert first > 1000 and steady > first // 2


@GLIBC_ONLY
def test_with_keep_heap_every_thread_allocates_from_the_one_arena():
    def arenas(heap: str) -> int:
        out = subprocess.run([sys.executable, "-c", THREAD_ARENAS, heap], capture_output=True,
                             text=True, check=True)
        return out.stderr.count("Arena ")

    assert arenas("give back") >= 2  # the thread's arena of its own beside the main one
    assert arenas("keep") == 1


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
