"""Keep freed memory in the process for the next large buffer (glibc's allocator), for the processes that
move device-web bodies: daphne and the bridge.

A body chunk passes through several buffers of up to 1 MiB (a socket read, the WebSocket frame, its
unmasking, the message joined from its pieces). glibc serves blocks that large with fresh ``mmap`` pages
and gives them back to the system when freed (``munmap``, or trimming the top of the heap past 2 x the
block size), so the next buffer takes a page fault for every 4 KiB it touches: copying 1 MiB into such a
buffer cost 1.1 ms on the benchmark machine instead of 0.07 ms into memory already mapped, and most of the
CPU that daphne and the bridge spent per MiB was these faults. ``keep_freed_memory`` makes blocks below
``MMAP_THRESHOLD`` come from the heap and keeps up to ``TRIM_THRESHOLD`` of freed heap mapped. The cost is
that much resident memory at most, per arena, after a burst.

Standard library only (the clients import it too); keep it importable on Python 3.9. Elsewhere than glibc
(macOS, musl, Windows) it does nothing.
"""

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 16 * 1024 * 1024  # above the largest tunnel frame (clients.protocol.MAX_FRAME_BYTES, 4 MiB)
TRIM_THRESHOLD = 64 * 1024 * 1024

_done = False


def keep_freed_memory() -> bool:
    """Tune glibc's allocator once per process (see the module's doc); True when it took effect."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Both set explicitly: setting either one stops glibc from adjusting the other by itself.
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
