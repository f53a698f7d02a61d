"""Process-level settings for speed, applied at start-up of training and benchmarks.

glibc's malloc serves allocations above its mmap threshold (at most 32 MiB) with fresh mmaps and
returns them with munmap on free, so every step that allocates the (batch x items) logits or a
gradient of the (items x 600) layers pays for page faults on tens of MiB. `tune_cpu_allocator`
uses mallopt(3) to keep such blocks in the heap (M_MMAP_MAX = 0) and not trim it after each
step (M_TRIM_THRESHOLD), so freed buffers are reused warm. Set VAECF_MALLOPT=0 to skip it.

One history's product with a float32 output layer (1 x d times d x n_items: a read of the
layer) runs through numpy's BLAS on AMD CPUs, on one thread: PyTorch's MKL reaches ~28 GB/s
there (Zen 5, 20,108 x 600: 1.65 ms with 2 threads), numpy's OpenBLAS 1.36 ms on one thread
(0.73 on two, but its thread pool beside PyTorch's OpenMP threads on 2 cores turned a 2.4 ms
answer into 8 ms: `one_blas_thread` keeps it to the calling thread). benchmarks/README.md.

OpenBLAS (bundled in numpy's and scipy's wheels) keeps its worker threads spinning for 2^28
cycles (~0.1 s) after each call, so the PyTorch work that follows a scipy solve on the same
cores (EASE/EDLAE's scoring of each solved B) ran beside them. `calm_openblas`, run when vaecf is
imported, lets them spin 2^20 cycles (~0.3 ms) before they sleep: EDLAE's search as `auto` runs
it on ML-1M took 91.6 and 93.8 s -> 70.8 and 70.5 s (Zen 5; benchmarks/README.md, "EASE/EDLAE:
what a search point costs").

`lower_thread_priority` raises the calling thread's niceness (Linux sets it per thread, and the
threads it starts, OpenMP's helpers among them, inherit it): `vaecf serve --scoring-nice` runs
its scoring thread so, for the event loop to outrank the helpers that spin after each call.
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
OPENBLAS_SPIN = "20"  # OPENBLAS_THREAD_TIMEOUT: its threads spin 2^20 cycles, then sleep


def calm_openblas() -> None:
    """Shorten the spin of OpenBLAS's idle threads in the libraries loaded from now on (each
    reads OPENBLAS_THREAD_TIMEOUT when it loads); a value already set is kept."""
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_SPIN)


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
def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (vendor_id, model name, cpu family, model,
    flags, ...); empty where there is none."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():  # the end of the first processor's block
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_vendor() -> str:
    """The CPU's vendor_id (GenuineIntel, AuthenticAMD, ...); "" where unknown."""
    return cpuinfo().get("vendor_id", "")


def numpy_gemv_faster() -> bool:
    """Whether one row times a float32 matrix is faster in numpy's BLAS on one thread than in
    PyTorch's: on AMD CPUs (above)."""
    return cpu_vendor() == "AuthenticAMD"


@functools.cache
def _numpy_blas():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's BLAS on the calling thread alone while inside (its pool's threads would contend
    with PyTorch's for the cores)."""
    with _numpy_blas().limit(limits=1):
        yield


def lower_thread_priority(nice: int) -> None:
    """The calling thread's niceness raised by `nice` (capped at 19; nothing off Linux, or for
    0). At equal priority the scheduler let a scoring thread's spinning OpenMP helper keep a
    core for milliseconds while the event loop, woken to send the answer, waited for it
    (benchmarks/README.md, "What serving adds at concurrency 1")."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):  # a niceness can always be raised; a sandbox may refuse
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
