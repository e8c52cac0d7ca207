"""Give freed tensor memory back to the system at once.

glibc serves an allocation of 128 KiB or more with its own mmap and returns it on
free, but after the first such free it raises that threshold (up to 32 MiB) and
serves later ones from its heap, where freed memory stays in the process. The
data plane allocates and frees a fragment's worth of bytes at every send, pull
and merge (messages, decoded updates, new globals), so a process's resident
memory crept up by several times the model over a run (bench scale). Setting the
threshold fixes it where it is, so every large buffer goes back when it is freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
THRESHOLD_BYTES = 128 * 1024

log = logging.getLogger("archipelago.malloc")


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold at 128 KiB; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
    except (OSError, AttributeError, TypeError):
        log.info("the C library has no mallopt: freed memory is returned as it decides")
        return False
