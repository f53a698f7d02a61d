"""The sparse EASE/EDLAE solver's approximation alone: test NDCG@100 of the dense solve and of
the neighbourhood solve at several neighbour counts, at fixed (lambda, p), on one prepared split.

    python benchmarks/sparse_neighbours.py --data PREPARED_DIR [--neighbours 128,256,512,1024]
        [--points 100:0.2,300:0.33,100:0] [--ties id|popular]

The Gram holds the training rows and the held-out users' fold-in rows (as `--model edlae`
fits it). Prints, per (lambda, p), the dense figure, then each neighbour count's with its
seconds. `--ties popular` breaks ties of co-occurrence count by the more popular item instead
of the solver's lower id (an experiment: the package keeps the lower id).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
import torch

import vaecf.models.neighbourhood as nb
from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.evaluate import evaluate_scores
from vaecf.models.ease import _metrics_of, linear_weights
from vaecf.models.neighbourhood import neighbour_weights, sparse_b_rows


def popular_first(gram: sp.csr_matrix, k: int, *_) -> tuple[np.ndarray, np.ndarray]:
    """`neighbours_of` with ties of count broken by the more popular item, then the lower id
    (every item's; the solver is run without a popular tier and with the count rank)."""
    n, diag = gram.shape[0], gram.diagonal()
    out, strongest = np.full((n, k), n, dtype=np.int64), np.arange(n)
    for j in range(n):
        lo, hi = gram.indptr[j], gram.indptr[j + 1]
        cols, vals = gram.indices[lo:hi], gram.data[lo:hi]
        cols, vals = cols[cols != j], vals[cols != j]
        if len(cols):
            cols = cols[np.lexsort((cols, -diag[cols], -vals))[:k]]
            strongest[j] = cols[0]
        out[j, : len(cols)] = np.sort(cols)
    return out, strongest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--neighbours", default="128,256,512,1024")
    ap.add_argument("--points", default="100:0.2,300:0.33,100:0", help="lambda:p,...")
    ap.add_argument("--ties", choices=["id", "popular"], default="id")
    a = ap.parse_args()
    if a.ties == "popular":
        nb.neighbours_of = popular_first
    ds = PreparedDataset(a.data)
    parts = [ds.split("train"), ds.split("validation_tr"), ds.split("test_tr")]
    x = sp.vstack(parts).tocsr().astype(np.float32)
    test = [CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te")]
    gram = torch.from_numpy((x.T @ x).toarray())
    n = x.shape[1]
    print(f"{n:,} items, {torch.get_num_threads()} threads; test NDCG@100")
    print(f"{'lambda':>7s} {'p':>5s} {'solver':>10s} {'ndcg@100':>9s} {'seconds':>8s}")
    for point in a.points.split(","):
        l2, p = (float(v) for v in point.split(":"))
        t0 = time.perf_counter()
        w = linear_weights(gram, l2, p)
        s = time.perf_counter() - t0
        print(f"{l2:7g} {p:5g} {'dense':>10s} {_metrics_of(w, *test)['ndcg@100']:9.4f} {s:8.1f}")
        for k in (int(v) for v in a.neighbours.split(",")):
            t0 = time.perf_counter()
            b = neighbour_weights(x, l2, p, k, torch.device("cpu"))
            s = time.perf_counter() - t0
            m = evaluate_scores(lambda batch, b=b: sparse_b_rows(*b, batch, n), *test)
            print(f"{l2:7g} {p:5g} {f'k {k}':>10s} {m['ndcg@100']:9.4f} {s:8.1f}")


if __name__ == "__main__":
    main()
