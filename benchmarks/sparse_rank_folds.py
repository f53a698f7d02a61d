"""The sparse solver's neighbour rank judged on the training folds' users: fold NDCG@100 of the
dense solve and of the sparse solve (256 neighbours, 1,024 for the 2% most popular items)
with each rank, at given lambdas and popularity penalties beta, on the 5 folds that
`--selection cv` draws (every training user with 5+ items: ~500 a split on ml-latest-small,
~800 on FilmTrust, against 50 and 150 test users).

    python benchmarks/sparse_rank_folds.py --data DIR/ml-latest-small/data/seed-S --p 0.33 \\
        [--l2 100,177.8] [--betas 0,0.1,0.25] [--rank count,cosine,contribution]

Ranks of item i as a neighbour of item j: the package's count (G_ij) and cosine
(G_ij / sqrt(G_ii)); contribution, sqrt(G_ii) G_ij / (G_ii + Lambda_i) (cosine shrunk by the
ridge for rare items; tried, not kept).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from linear_select_cv import floats
from sparse_calibrate import fold_grams

import vaecf.models.neighbourhood as nb
from vaecf.models.ease import _beta_metrics, linear_weights

PACKAGE_RANKS = nb.rank_weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="one split of a compare run's data")
    ap.add_argument("--p", type=float, required=True, help="EDLAE's dropout (0: EASE)")
    ap.add_argument("--l2", default="100,177.8")
    ap.add_argument("--betas", default="0,0.1,0.25")
    ap.add_argument("--rank", default="count,cosine")
    a = ap.parse_args()
    l2s, betas, ranks = floats(a.l2), floats(a.betas), a.rank.split(",")
    sums: dict = {}
    for g, diag, fold in fold_grams(a.data):
        n = g.shape[0]
        for l2 in l2s:
            lam = l2 + a.p / (1 - a.p) * g.diagonal().astype(np.float64)
            dense = linear_weights(torch.from_numpy(g.toarray()), l2, a.p).float()
            got = {"dense": _beta_metrics(dense, diag, betas, *fold)}
            del dense
            for rank in ranks:
                nb.rank_weights = lambda r, d, lam=lam: (
                    np.sqrt(d) / (d + lam) if r == "contribution" else PACKAGE_RANKS(r, d)
                )
                try:
                    parts = nb.neighbour_weights(
                        None, l2, a.p, 256, torch.device("cpu"), torch.float32, g, 0.02, 1024,
                        rank,
                    )  # fmt: skip
                finally:
                    nb.rank_weights = PACKAGE_RANKS
                got[rank] = _beta_metrics(
                    lambda t, b=parts, n=n: nb.sparse_b_rows(*b, t, n), diag, betas, *fold
                )
            for name, per_beta in got.items():
                for beta, m in zip(betas, per_beta):
                    acc = sums.setdefault((name, l2, beta), [0.0, 0])
                    acc[0] += m["ndcg@100"] * m["n_users"]
                    acc[1] += m["n_users"]
    users = next(iter(sums.values()))[1]
    print(f"{a.data}, p {a.p:g}: fold NDCG@100 ({users} users), rows lambda / beta")
    names = ["dense", *ranks]
    print("| lambda | beta | " + " | ".join(names) + " |")
    print("|---:|---:|" + "---:|" * len(names))
    for l2 in l2s:
        for beta in betas:
            cells = " | ".join(f"{sums[(k, l2, beta)][0] / users:.4f}" for k in names)
            print(f"| {l2:g} | {beta:g} | {cells} |")


if __name__ == "__main__":
    main()
