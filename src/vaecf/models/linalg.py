"""The models' dense linear algebra on one guarded path: every LAPACK and BLAS call of the
linear family (EASE, EDLAE, the hybrid), the neighbourhood solver and inf-AE goes through this
module; tests/models/test_linalg.py checks that no other module makes one (the sparse solver's
small systems are factored by compiled loops of its own, in vaecf.models.gather).

Why guarded: OpenBLAS's multithreaded SYRK (run by its own syrk, by potrf's trailing updates and
by potri's lauum) packs each thread's share of the columns, GEMM_Q x share x itemsize bytes,
into a fixed 32 MiB buffer with no bound check. On two threads the first thread's share is 0.71
n, so past a size set by the kernel's GEMM_Q it writes beyond the buffer: a SIGSEGV when the
next page is unmapped, silently corrupted memory when it is not. Measured with scipy 1.17's
OpenBLAS 0.3.30 on an Intel Emerald Rapids (SkylakeX kernels: GEMM_Q 448 float32, 384 float64),
two threads: spotrf crashes from 26,500 items on (26,000 ran past the first update, where it
crashes, without a fault), dpotrf from 16,000 (15,000 ran); the Haswell kernels (GEMM_Q 320)
from 40,000 float32 (32,602 runs). One thread takes the unthreaded path and never crashes, but
took 240 s at 32,602 items against PyTorch's 148 s (`benchmarks/dense_solve.py`).

So scipy's LAPACK, the faster solver on these CPUs (1.24x PyTorch's at 20,000 items on that
Intel, 1.86x on a Zen 3 at 5,000), is used only where the largest x86-64 kernel's buffer need
stays well inside the buffer: n x itemsize <= OPENBLAS_ROW_BYTES (22,000 items in float32,
11,000 in float64; SkylakeX's need there is 27.4 and 23.1 MB of the 32 MiB, and the edges
measured above sit 18-20% and 36-45% higher). Beyond it, and on other architectures (whose kernels
set other GEMM_Q), PyTorch's LAPACK (MKL in its x86-64 builds) does the same work in place.
"""

from __future__ import annotations

import platform

import numpy as np
import torch

# n x itemsize of the largest matrix scipy's OpenBLAS factors, inverts or updates on the CPU
OPENBLAS_ROW_BYTES = 88_000
X86 = platform.machine().lower() in ("x86_64", "amd64")


def openblas_safe(n: int, dtype: torch.dtype) -> bool:
    """Whether scipy's OpenBLAS may run a threaded level-3 call on an (n, n) `dtype` matrix."""
    return (
        X86 and dtype in (torch.float32, torch.float64) and n * dtype.itemsize <= OPENBLAS_ROW_BYTES
    )


def solver(n: int, dtype: torch.dtype, device: torch.device) -> str:
    """The LAPACK `spd_inverse` uses for an (n, n) `dtype` matrix on `device`: "scipy"
    (OpenBLAS) or "torch"."""
    return "scipy" if device.type == "cpu" and openblas_safe(n, dtype) else "torch"


class NotPositiveDefinite(ValueError):
    """The matrix handed to a Cholesky factorisation has no such factor."""


def spd_inverse(a: torch.Tensor, path: str | None = None) -> torch.Tensor:
    """The inverse of the symmetric positive definite (n, n) `a`, by Cholesky, computed in
    `a`'s memory. On the CPU through scipy's LAPACK where `openblas_safe`, else through
    PyTorch's on `a`'s transpose (the same symmetric matrix, column-major, so its LAPACK works
    in place: no second n^2 array); on a GPU PyTorch's, the factor in a second array. `path`
    ("scipy" or "torch") overrides the choice on the CPU, for the benchmarks and tests."""
    if a.device.type != "cpu":
        return torch.cholesky_inverse(cholesky(a), out=a)
    if (path or solver(a.shape[0], a.dtype, a.device)) == "torch":
        at = a.mT  # row-major a is the column-major matrix LAPACK wants, in place
        info = torch.empty((), dtype=torch.int32, device=a.device)
        torch.linalg.cholesky_ex(at, out=(at, info))
        if int(info):
            raise NotPositiveDefinite
        return torch.cholesky_inverse(at, out=at).mT
    from scipy.linalg import lapack

    f = a.numpy().T  # the same symmetric matrix, Fortran-ordered: LAPACK works in place
    potrf, potri = (
        (lapack.dpotrf, lapack.dpotri) if f.dtype == np.float64 else (lapack.spotrf, lapack.spotri)
    )
    c, info = potrf(f, lower=1, overwrite_a=1, clean=0)
    if info:
        raise NotPositiveDefinite
    c, info = potri(c, lower=1, overwrite_c=1)
    if info:
        raise NotPositiveDefinite
    out = torch.from_numpy(c.T)  # the inverse's upper triangle (row-major view), junk below
    _mirror_upper(out)
    return out


def _mirror_upper(m: torch.Tensor, tile: int = 512) -> None:
    """Copy the upper triangle of square `m` onto its lower one, tile by tile (cache-sized
    copies, no n_items^2 temporaries)."""
    n = m.shape[0]
    for i in range(0, n, tile):
        d = m[i : i + tile, i : i + tile]
        d.copy_(d.triu() + d.triu(1).T)
        for j in range(0, i, tile):
            m[i : i + tile, j : j + tile].copy_(m[j : j + tile, i : i + tile].T)


def cholesky(a: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor of `a` (a batch of matrices too), through PyTorch's LAPACK."""
    chol, info = torch.linalg.cholesky_ex(a)
    if int(info.max()):
        raise NotPositiveDefinite
    return chol


def cholesky_solve(b: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """x with (chol chol^T) x = b."""
    return torch.cholesky_solve(b, chol)


# systems factored together: a few MiB of them, so that a group's factorisation stays in cache
SYSTEMS_BYTES = 2**23
FACTOR_BASE = 32  # blocks of at most this size go to LAPACK's unblocked factorisation


def spd_solve_batch(a: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """(J, k) x with a_j x_j = rhs_j for a batch of symmetric positive definite (J, k, k)
    systems (on the CPU `a` overwritten by its lower Cholesky factors); NotPositiveDefinite if
    one is not.
    Factored by halves (`_factor_`), so that nearly all the flops are batched products: on 2
    cores of an Intel Xeon with AMX, 1.6x LAPACK's batched potrf + potrs at k = 256 and 3.7x
    at k = 1,024 (benchmarks/README.md, "The sparse solver: time"). On a GPU, one batched
    potrf and potrs for the whole batch (cuSOLVER's), as before the halves."""
    if a.device.type != "cpu":
        return cholesky_solve(rhs[:, :, None], cholesky(a))[:, :, 0]
    group = max(4, SYSTEMS_BYTES // (a.shape[1] * a.shape[2] * a.element_size()))
    out = torch.empty_like(rhs)
    for s in range(0, a.shape[0], group):
        chol = a[s : s + group]
        _factor_(chol)
        y = torch.linalg.solve_triangular(chol, rhs[s : s + group, :, None], upper=False)
        out[s : s + group] = torch.linalg.solve_triangular(chol.mT, y, upper=True)[:, :, 0]
    return out


def _factor_(a: torch.Tensor) -> None:
    """a (J, n, n) := its lower Cholesky factors, zero above the diagonal: the leading half
    factored (recursively), the trailing rows solved against it and the trailing block updated
    by one batched product, then factored (recursively)."""
    n = a.shape[-1]
    if n <= FACTOR_BASE:
        chol, info = torch.linalg.cholesky_ex(a)
        if int(info.max()):
            raise NotPositiveDefinite
        a.copy_(chol)
        return
    h = (n // 2 + 15) // 16 * 16
    a11, a21, a22 = a[:, :h, :h], a[:, h:, :h], a[:, h:, h:]
    _factor_(a11)
    a[:, :h, h:].zero_()
    a21.copy_(torch.linalg.solve_triangular(a11.mT, a21, upper=True, left=False))
    a22.baddbmm_(a21, a21.mT, alpha=-1)
    _factor_(a22)


def add_gram_(gram: torch.Tensor, k: torch.Tensor) -> None:
    """gram += k^T k for a block of rows k (B, L): on the CPU through BLAS syrk where
    `openblas_safe`, which forms the lower triangle alone at half a product's flops (the
    caller completes the matrix once every block is in); elsewhere a whole product."""
    if gram.device.type != "cpu" or not openblas_safe(gram.shape[0], gram.dtype):
        gram.addmm_(k.T, k)
        return
    from scipy.linalg import blas

    syrk = blas.dsyrk if gram.dtype == torch.float64 else blas.ssyrk
    # C-ordered (L, L) and (B, L) arrays are the Fortran (L, L) and (L, B) transposes: the
    # Fortran upper triangle of a a^T is gram's lower triangle, written in place
    c = gram.numpy().T
    out = syrk(1.0, k.contiguous().numpy().T, beta=1.0, c=c, trans=0, lower=0, overwrite_c=1)
    if not np.shares_memory(out, c):
        raise RuntimeError("BLAS syrk did not update the Gram matrix in place")


def inverse_update_(p: torch.Tensor, w: torch.Tensor, s: torch.Tensor, sign: float) -> None:
    """p <- (p^-1 + sign U^T U)^-1 in place (Woodbury), for the rows U of a symmetric p, given
    w = U p and s = I + sign U p U^T (positive definite where the result is): p -= sign v^T v,
    v = L^-1 w, L L^T = s. NotPositiveDefinite where s is not."""
    v = torch.linalg.solve_triangular(cholesky(s), w, upper=False)
    add_outer_(p, v, -sign)


MIRROR_ROWS = 6  # add_outer_ by blocks from n / MIRROR_ROWS rows on (see there)


def add_outer_(p: torch.Tensor, v: torch.Tensor, alpha: float, blocks: int = 4) -> None:
    """p += alpha v^T v for a symmetric p (n, n) and v (r, n). For r >= n / MIRROR_ROWS: by
    `blocks` blocks of rows, each multiplied up to the diagonal (5/8 of one product's flops at
    4), the blocks above copied from their mirror; for fewer rows one product, as the copies
    (transposed, n^2 / 2 elements) then cost more than the flops spared."""
    n = p.shape[0]
    if v.shape[0] * MIRROR_ROWS < n:
        p.addmm_(v.T, v, alpha=alpha)
        return
    edges = [n * i // blocks for i in range(blocks + 1)]
    for a, b in zip(edges, edges[1:]):
        p[a:b, :b].addmm_(v[:, a:b].T, v[:, :b], alpha=alpha)
    for a, b in zip(edges, edges[1:]):
        p[a:b, b:].copy_(p[b:, a:b].T)
