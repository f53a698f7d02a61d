"""An experiment for the sparse EASE/EDLAE solver (not in the package yet): refine each item's
neighbourhood once. Solve item j's regression on its k most co-occurring items (the solver's
rule), then drop the `--swap` neighbours with the smallest |weight| and add the co-occurring
outsiders with the largest normalised residual correlation |G_ij - (G B)_ij| / sqrt(G_ii +
Lambda_i) (the greedy step of orthogonal matching pursuit: the outsiders whose weight would most
reduce the ridge loss), and solve again. Test NDCG@100 of the dense solve, the count rule and
the refined neighbourhoods, at fixed (lambda, p), on one prepared split.

    python benchmarks/sparse_refine.py --data PREPARED_DIR [--neighbours 256] [--swap 128]
        [--l2 100] [--p 0.2]

Dense n_items^2 arrays are used to compute the residuals: a few thousand items only.
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


def refined_neighbours(gram: sp.csr_matrix, b, lam: np.ndarray, k: int, swap: int) -> np.ndarray:
    """(n, k) each item's neighbours after one swap step, padded with n, sorted."""
    n = gram.shape[0]
    bm = sp.csr_matrix((b[2].numpy(), b[1].numpy(), b[0].numpy()), shape=(n, n))
    bc = bm.tocsc()  # column j: item j's neighbours and weights
    g = gram.toarray()
    grad = np.abs(g - (gram @ bm).toarray()) / np.sqrt(np.diag(g) + lam)[:, None]
    out = np.full((n, k), n, dtype=np.int64)
    for j in range(n):
        sup = bc.indices[bc.indptr[j] : bc.indptr[j + 1]]
        w = bc.data[bc.indptr[j] : bc.indptr[j + 1]]
        keep = sup[np.argsort(-np.abs(w))[: max(0, len(sup) - swap)]]
        score = grad[:, j].copy()
        score[g[:, j] == 0] = -1.0  # co-occurring items only
        score[j] = score[sup] = -1.0
        add = np.argsort(-score)[: k - len(keep)]
        chosen = np.sort(np.concatenate([keep, add[score[add] > 0]]))[:k]
        out[j, : len(chosen)] = chosen
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--neighbours", type=int, default=256)
    ap.add_argument("--swap", type=int, default=128)
    ap.add_argument("--l2", type=float, default=100.0)
    ap.add_argument("--p", type=float, default=0.2)
    a = ap.parse_args()
    ds = PreparedDataset(a.data)
    parts = [ds.split("train"), ds.split("validation_tr"), ds.split("test_tr")]
    x = sp.vstack(parts).tocsr().astype(np.float32)
    test = [CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te")]
    n = x.shape[1]
    gram = (x.T @ x).tocsr()
    gram.sort_indices()
    lam = a.l2 + a.p / (1 - a.p) * gram.diagonal()
    dense = linear_weights(torch.from_numpy(gram.toarray()), a.l2, a.p)
    print(f"{n:,} items, lambda {a.l2:g}, p {a.p:g}; test NDCG@100")
    print(f"dense                {_metrics_of(dense, *test)['ndcg@100']:.4f}")

    def ndcg(b) -> float:
        return evaluate_scores(lambda batch: nb.sparse_b_rows(*b, batch, n), *test)["ndcg@100"]

    t0 = time.perf_counter()
    b = nb.neighbour_weights(x, a.l2, a.p, a.neighbours, torch.device("cpu"), gram=gram.copy())
    s = time.perf_counter() - t0
    print(f"count, {a.neighbours:<4d}         {ndcg(b):.4f}  ({s:.1f} s)")
    t0 = time.perf_counter()
    nbrs = refined_neighbours(gram, b, lam, a.neighbours, a.swap)
    count_rule = nb.neighbours_of
    nb.neighbours_of = lambda g, k, *_: (nbrs, count_rule(g, k)[1])
    try:
        b2 = nb.neighbour_weights(x, a.l2, a.p, a.neighbours, torch.device("cpu"), gram=gram)
    finally:
        nb.neighbours_of = count_rule
    s = time.perf_counter() - t0
    print(f"refined, swap {a.swap:<4d}   {ndcg(b2):.4f}  ({s:.1f} s more)")


if __name__ == "__main__":
    main()
