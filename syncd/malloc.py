"""Give freed fragment-sized memory back to the system at once, and only that.

glibc serves an allocation at or above its mmap threshold with its own mmap and
returns it on free; below, from its heap, where freed memory stays in the
process for reuse. By default the threshold starts at 128 KiB and, after the
first such free, rises to the size freed (up to 32 MiB). The data plane
allocates and frees a fragment's worth of bytes at every send, pull and merge
(messages, decoded updates, new globals), so with the rising threshold a
process's resident memory crept up by several times the model over a run
(bench scale).

Fixing the threshold stops the rise. It is fixed at glibc's ceiling, 32 MiB, not
at the 128 KiB start: at 128 KiB every activation and gradient of a training
step is also mmapped, faulted in page by page and unmapped again, which made a
bare training step of the demo's model about 45% slower (54 ms against 80 ms on
one core; the system's merged tokens/s fell by a third, `bench efficiency`).
Training's buffers below 32 MiB now stay in the heap and are reused step after
step; fragments at real sizes are far above it and go back when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's ceiling for the threshold on 64-bit

log = logging.getLogger("archipelago.malloc")


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold at 32 MiB; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
    except (OSError, AttributeError, TypeError):
        log.info("the C library has no mallopt: freed memory is returned as it decides")
        return False
