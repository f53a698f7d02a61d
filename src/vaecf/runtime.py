"""Process-level settings for speed, applied at start-up of training and benchmarks.

glibc's malloc serves allocations above its mmap threshold (at most 32 MiB) with fresh mmaps and
returns them with munmap on free, so every step that allocates the (batch x items) logits or a
gradient of the (items x 600) layers pays for page faults on tens of MiB. `tune_cpu_allocator`
uses mallopt(3) to keep such blocks in the heap (M_MMAP_MAX = 0) and not trim it after each
step (M_TRIM_THRESHOLD), so freed buffers are reused warm. Set VAECF_MALLOPT=0 to skip it.

On AMD CPUs the float32 output layer's product runs faster in numpy's BLAS (OpenBLAS in
numpy's wheels) than in PyTorch's MKL at every batch size (Zen 5, 600 x 20,108: one row 0.67
against 1.65 ms, 256 rows 27 against 41 ms, both on 2 threads). The two libraries' thread pools
must not both be awake on the same cores (one row's answer went from 2.4 ms to 8 ms; under
micro-batched load, batches through one alternating with rows through the other lost 20%). So
serving holds PyTorch to one thread for a whole scoring call (`openmp_held`) and gives numpy's
BLAS its pool for the products (`numpy_blas`); elsewhere (training's validation, other callers)
only one row's product goes through numpy, on the calling thread. benchmarks/README.md.
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


def openmp_is_held() -> bool:
    """Whether the calling thread is inside `openmp_held`."""
    return getattr(_held, "on", False)


@contextlib.contextmanager
def numpy_blas() -> Iterator[None]:
    """numpy's BLAS on its pool inside `openmp_held`, else on the calling thread alone (its
    pool beside PyTorch's OpenMP threads turned 2.4 ms answers into 8 ms)."""
    if openmp_is_held():
        yield
        return
    with _pool("blas").limit(limits=1):
        yield
