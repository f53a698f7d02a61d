"""Probe: can scipy's SuperLU factor a sparsified Gram (SANSA's route) at catalogue scale?

SANSA (Spisak et al., RecSys 2023) factors a sparsified X^T X + lambda I as L D L^T and inverts
L approximately. scipy has no sparse Cholesky, but SuperLU with symmetric mode and no pivoting
gives the same factor. This keeps each item's `--keep` strongest off-diagonal entries (by
cosine; symmetrised), adds lambda, factors it and prints the seconds and the factor's size.

    python benchmarks/probe_sparse_lu.py --items 10000 --keep 20
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spl

from vaecf.bench.speed import synthetic_csr


def sparsified(g: sp.csr_matrix, keep: int, l2: float) -> sp.csc_matrix:
    d = g.diagonal().astype(np.float64)
    c = g.tocoo()
    off = c.row != c.col
    r, col, v = c.row[off], c.col[off], c.data[off].astype(np.float64)
    order = np.lexsort((-v / np.sqrt(d[r] * d[col]), col))
    starts = np.searchsorted(col[order], np.arange(g.shape[0]))
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.append(starts, len(order))))
    kept = order[rank < keep]
    a = sp.coo_matrix((v[kept], (r[kept], col[kept])), shape=g.shape).tocsc()
    return (a.maximum(a.T) + sp.diags(d + l2)).tocsc()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=10000)
    ap.add_argument("--keep", type=int, default=20, help="off-diagonal entries kept per item")
    ap.add_argument("--l2", type=float, default=500.0)
    a = ap.parse_args()
    x = synthetic_csr(int(3.3 * a.items), a.items, 100 * a.items, seed=0)
    g = (x.T @ x).tocsr()
    m = sparsified(g, a.keep, a.l2)
    print(f"{a.items:,} items, Gram {g.nnz:,} non-zeros, sparsified {m.nnz:,}")
    for perm in ("MMD_AT_PLUS_A", "COLAMD"):
        t = time.perf_counter()
        lu = spl.splu(m, permc_spec=perm, diag_pivot_thresh=0.0, options={"SymmetricMode": True})
        density = lu.L.nnz / a.items**2
        print(f"{perm}: {time.perf_counter() - t:.1f} s, L {lu.L.nnz:,} non-zeros ({density:.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
