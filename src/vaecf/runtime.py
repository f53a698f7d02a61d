"""Process-level settings for speed, applied at start-up of training and benchmarks.

glibc's malloc serves allocations above its mmap threshold (at most 32 MiB) with fresh mmaps and
returns them with munmap on free, so every step that allocates the (batch x items) logits or a
gradient of the (items x 600) layers pays for page faults on tens of MiB. `tune_cpu_allocator`
uses mallopt(3) to keep such blocks in the heap (M_MMAP_MAX = 0) and not trim it after each
step (M_TRIM_THRESHOLD), so freed buffers are reused warm. Set VAECF_MALLOPT=0 to skip it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
_tuned = False


def tune_cpu_allocator() -> bool:
    """Apply the mallopt settings once per process (Linux/glibc only); True if applied."""
    global _tuned
    if (
        _tuned
        or os.environ.get("VAECF_MALLOPT", "1") == "0"
        or not sys.platform.startswith("linux")
    ):
        return _tuned
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    except (OSError, AttributeError):  # not glibc
        return False
    _tuned = bool(ok)
    return _tuned
