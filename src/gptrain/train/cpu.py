"""CPU process settings for training.

glibc serves every allocation above its mmap threshold with a fresh mmap and gives it back on
free, so a training step that allocates and frees hundreds of MB of activations page-faults all
of it in again every step. Keeping freed memory in the heap (what jemalloc or tcmalloc do, and
what PyTorch's CPU performance guide recommends them for) removed a third of the step time of
bench/train_throughput.py on a 2-core machine. The price: the process keeps its peak memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Tell glibc malloc to never mmap and never trim; False where this is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, ctypes.c_int(2**31 - 1)))
