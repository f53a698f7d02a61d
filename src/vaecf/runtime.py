"""Process-level settings for speed, applied at start-up of training and benchmarks.

glibc's malloc serves allocations above its mmap threshold (at most 32 MiB) with fresh mmaps and
returns them with munmap on free, so every step that allocates the (batch x items) logits or a
gradient of the (items x 600) layers pays for page faults on tens of MiB. `tune_cpu_allocator`
uses mallopt(3) to keep such blocks in the heap (M_MMAP_MAX = 0) and not trim it after each
step (M_TRIM_THRESHOLD), so freed buffers are reused warm. Set VAECF_MALLOPT=0 to skip it.

One history's product with a float32 output layer (1 x d times d x n_items: a read of the
layer) runs through numpy's BLAS on AMD CPUs: PyTorch's MKL reaches ~28 GB/s there (Zen 5,
20,108 x 600: 1.65 ms on 2 threads), numpy's OpenBLAS 0.67 ms on its 2 threads and 1.36 on one.
Its pool and PyTorch's OpenMP threads must not both be awake on 2 cores (a 2.4 ms answer took
8 ms): a one-row answer holds PyTorch to one thread (`openmp_held`) and gives OpenBLAS its
pool; outside it, numpy's BLAS keeps to the calling thread (`numpy_blas`). benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys
import threading
from collections.abc import Iterator

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


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor_id (/proc/cpuinfo: GenuineIntel, AuthenticAMD, ...); "" elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def numpy_gemv_faster() -> bool:
    """Whether one row times a float32 matrix is faster in numpy's BLAS on one thread than in
    PyTorch's: on AMD CPUs (above)."""
    return cpu_vendor() == "AuthenticAMD"


@functools.cache
def _pool(api: str):
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api=api)


_held = threading.local()


@contextlib.contextmanager
def openmp_held() -> Iterator[None]:
    """PyTorch's OpenMP threads held to the calling thread while inside, so that numpy's BLAS
    may use its own pool (`numpy_blas`) without the two pools spinning against each other."""
    with _pool("openmp").limit(limits=1):
        _held.on = True
        try:
            yield
        finally:
            _held.on = False


@contextlib.contextmanager
def numpy_blas() -> Iterator[None]:
    """numpy's BLAS on its pool inside `openmp_held`, else on the calling thread alone (its
    pool beside PyTorch's OpenMP threads turned 2.4 ms answers into 8 ms)."""
    if getattr(_held, "on", False):
        yield
        return
    with _pool("blas").limit(limits=1):
        yield
