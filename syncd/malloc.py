"""Give freed fragment-sized memory back to the system at once, and only that.

glibc serves an allocation at or above its mmap threshold with its own mmap and
returns it on free; below, from its heap, where freed memory stays in the
process for reuse unless the heap's free top is above the trim threshold. By
default the threshold starts at 128 KiB and, after the first such free, rises to
the size freed (up to 32 MiB), the trim threshold with it. The data plane
allocates and frees a fragment's worth of bytes at every send, pull and merge
(messages, decoded updates, new globals), so with the rising threshold a
process's resident memory crept up by several times the model over a run
(bench scale).

Fixing the threshold stops the rise. It is fixed at glibc's ceiling, 32 MiB, not
at the 128 KiB start: at 128 KiB every activation and gradient of a training
step is also mmapped, faulted in page by page and unmapped again, which slows a
bare training step and the system's merged tokens/s (`bench efficiency`).

Fixing it also fixes the trim threshold at its 128 KiB start, which gives the
heap's free top back after every step: a training step's gradients and
activations (all below 32 MiB a tensor) would be faulted in again page by page at
every step. So a process that trains (an island, a standby, a bare loop of bench
efficiency) keeps its heap (keep_heap: the trim threshold fixed high): its step's
buffers below 32 MiB stay and are reused step after step, while fragments at real
sizes are far above 32 MiB and go back when freed. syncd does not: keeping its
heap gained its ingest nothing and raised its peak (`bench dataplane`).

A process that keeps its heap also keeps one arena (M_ARENA_MAX 1): glibc gives
each thread that allocates an arena of its own, which keeps its freed memory as
the heap does, so an island's encoding, pull and link threads would each hold
their own high-water mark beside the training thread's, which raises the
island's peak; in one arena what one thread frees is reused by the next that
allocates.
A process whose heap is warm but that will idle a while gives its free heap back
with give_back_heap (a warm standby after its throwaway step); fault_in brings it
in again ahead of the work (an island while it pulls).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Iterable

import torch

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's ceiling for the mmap threshold on 64-bit
TRIM_BYTES = 2**31 - 1  # the largest trim threshold mallopt takes (an int)

log = logging.getLogger("archipelago.malloc")


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def return_large_frees(keep_heap: bool = False) -> bool:
    """Fix glibc's mmap threshold at 32 MiB and, with keep_heap, its trim threshold
    high and its arenas at one; False where the C library is not glibc."""
    libc = _libc()
    try:
        fixed = libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES)
        return bool(fixed and (not keep_heap or (libc.mallopt(M_TRIM_THRESHOLD, TRIM_BYTES)
                                                 and libc.mallopt(M_ARENA_MAX, 1))))
    except AttributeError:
        log.info("the C library has no mallopt: freed memory is returned as it decides")
        return False


def give_back_heap() -> bool:
    """Give the heap's free memory back to the system now (glibc's malloc_trim);
    False where there is no such call."""
    libc = _libc()
    try:
        libc.malloc_trim(0)
    except AttributeError:
        return False
    return True


def fault_in(like: Iterable[torch.Tensor], copies: int) -> int:
    """Allocate and touch `copies` tensors the size of each of `like` on the CPU, all
    held at once, then free them, so that the heap holds their pages when the work
    that needs them starts (a training step's gradients and AdamW's two moments: 3 x
    the parameters) instead of faulting them in then, in a process that keeps its
    heap (return_large_frees(keep_heap=True): its one arena holds every thread's
    frees; elsewhere glibc keeps a thread's frees in that thread's arena, so call it
    on the thread that will do the work). Tensors elsewhere than the CPU are
    skipped. Returns the bytes touched."""
    held = [torch.zeros_like(t) for t in like if t.device.type == "cpu"
            for _ in range(copies)]
    return sum(h.numel() * h.element_size() for h in held)
