"""Is the sparse solver's gap a matter of scale? Each of its columns of B is a regression on
the item's most co-occurring items only, and the neighbours it keeps take up what the cut
ones would have explained. This scales column j by (captured_j / total_j)^gamma, where
total_j is item j's co-occurrence with every other item (sum of G_ij, i != j) and captured_j
that with its kept neighbours (1 where nothing is cut), and scores the dense solve, the
sparse one, and each gamma on the training folds' users (5 folds as `--selection cv` draws
them: ~500 users a split on ml-latest-small, against 50 test users), over a lambda grid, at
the split's p and each popularity penalty beta.

    python benchmarks/sparse_calibrate.py --data DIR/ml-latest-small/data --splits 1:0.33,3:0.2
        [--l2 56.2,100,177.8,300,533.5] [--betas 0.1,0.25] [--gammas 0,0.25]

--splits: seed:p pairs (p, EDLAE's dropout, as the split's dense fit chose it).
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
import torch
from linear_select_cv import floats

from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.models.ease import _beta_metrics, cv_folds, linear_weights
from vaecf.models.neighbourhood import neighbour_weights, sparse_b_rows


def fold_grams(path: str):
    """The split's 5 folds as `--selection cv` draws them: each fold's Gram (X^T X of every
    row, the fold's users' rows cut to their fold-in items; CSR, sorted), its diagonal, and
    the fold's (fold-in, target) rows."""
    ds = PreparedDataset(path)
    train = ds.split("train").astype(np.float32).tocsr()
    rows = [train, ds.split("validation_tr"), ds.split("test_tr")]
    x = sp.vstack(rows).tocsr().astype(np.float32)
    gram = (x.T @ x).tocsr()
    for delta, f_in, f_te in cv_folds(train, 5, np.float32, 0):
        g = (gram + delta).tocsr()
        g.sort_indices()
        yield g, torch.from_numpy(g.diagonal()), (CSR.from_scipy(f_in), CSR.from_scipy(f_te))


def one_split(path: str, p: float, l2s, betas, gammas) -> dict:
    """(variant, beta, lambda) -> (NDCG@100 sum, users) over the split's folds."""
    out: dict = {}
    for g, diag, fold in fold_grams(path):
        n = g.shape[0]
        off = g.copy()
        off.setdiag(0)
        off.eliminate_zeros()
        total = np.asarray(off.sum(0)).ravel()
        for l2 in l2s:
            dense = linear_weights(torch.from_numpy(g.toarray()), l2, p).float()
            got = {"dense": _beta_metrics(dense, diag, betas, *fold)}
            del dense
            parts = neighbour_weights(None, l2, p, 256, torch.device("cpu"), torch.float32, g, 0.02)
            kept = sp.csr_matrix(
                (np.ones(parts[2].numel()), parts[1].numpy(), parts[0].numpy()), shape=(n, n)
            )
            captured = np.asarray(off.multiply(kept).sum(0)).ravel()
            share = np.where(captured > 0, captured / np.maximum(total, 1e-12), 1.0)
            for gamma in gammas:
                scale = torch.from_numpy((share**gamma).astype(np.float32))
                got[f"sparse, gamma {gamma:g}"] = _beta_metrics(
                    lambda t, s=scale, b=parts, n=n: sparse_b_rows(*b, t, n) * s, diag, betas, *fold
                )
            for name, per_beta in got.items():
                for beta, m in zip(betas, per_beta):
                    acc = out.setdefault((name, beta, l2), [0.0, 0])
                    acc[0] += m["ndcg@100"] * m["n_users"]
                    acc[1] += m["n_users"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a compare run's data directory")
    ap.add_argument("--splits", default="1:0.33,3:0.2", help="seed:p pairs")
    ap.add_argument("--l2", default="56.2,100,177.8,300,533.5")
    ap.add_argument("--betas", default="0.1,0.25")
    ap.add_argument("--gammas", default="0,0.25")
    a = ap.parse_args()
    l2s, betas, gammas = floats(a.l2), floats(a.betas), floats(a.gammas)
    for pair in a.splits.split(","):
        seed, p = pair.split(":")
        res = one_split(f"{a.data}/seed-{seed}", float(p), l2s, betas, gammas)
        print(f"seed {seed}, p {p}: fold NDCG@100 by lambda ({', '.join(f'{v:g}' for v in l2s)})")
        for name in dict.fromkeys(k[0] for k in res):
            for beta in betas:
                vals = [res[(name, beta, l2)][0] / res[(name, beta, l2)][1] for l2 in l2s]
                cells = " ".join(f"{v:.4f}" for v in vals)
                print(f"  {name:18s} beta {beta:<5g} {cells}   best {max(vals):.4f}")


if __name__ == "__main__":
    main()
