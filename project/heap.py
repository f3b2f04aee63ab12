"""A CPU training process keeps the memory its steps free, for its next step, rather than handing it back to the
kernel and faulting it in afresh (glibc's malloc, Linux).

glibc returns the free memory at the top of its heap to the kernel once it passes a threshold that it sets for
itself from the process's history. A step's activations are freed together at its end, so whether they pass it
varied from run to run: on the demo's CPU training, 0, 2,000 or 4,000 page faults a step in backward (each 4 KB,
1 ms a thousand), which made one run 10% slower than the next (benchmarks/README.md). Fixing both thresholds
keeps what a step freed: the process holds its peak memory, as a GPU's caching allocator does. Blocks over 32 MB
(glibc's largest mmap threshold: larger images' activations) still come from mmap each time; the README's recipe
for them (MALLOC_MMAP_MAX_=0) trades peak memory for speed, so it is the user's to choose. jemalloc or
tcmalloc (LD_PRELOAD) do the same and are left alone, as are a user's own settings (MALLOC_*, or GLIBC_TUNABLES's
glibc.malloc.*).
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest on 64-bit: blocks up to it come from the heap, and are reused
TRIM_THRESHOLD = 1024 * 1024 * 1024  # free memory the heap keeps at its top before it gives any back
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
TUNABLES = ("trim_threshold", "mmap_threshold", "top_pad", "mmap_max")  # the same, as GLIBC_TUNABLES's glibc.malloc.*
ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def keep_freed_memory() -> bool:
    """Make glibc keep the memory this process frees (both thresholds fixed); whether it was set. Nothing is set
    off Linux, under another C library, where the user set glibc's thresholds, or where another allocator is
    preloaded."""
    if not sys.platform.startswith("linux") or user_settings():
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, libc's among them (find_library would start ldconfig)
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):  # musl has a mallopt that does nothing
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def user_settings() -> bool:
    """Whether the user chose glibc's thresholds (MALLOC_*, GLIBC_TUNABLES) or preloaded another allocator."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return (
        any(name in os.environ for name in USER_SETTINGS)
        or any(f"glibc.malloc.{name}=" in tunables for name in TUNABLES)
        or any(name in os.environ.get("LD_PRELOAD", "") for name in ALLOCATORS)
    )
