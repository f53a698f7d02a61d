"""Which items the sparse solver should take as an item's neighbours: test NDCG@100 at a fixed
(lambda, p), no popularity penalty, of the dense solve and of the sparse solve with neighbours
ranked by co-occurrence count G_ij (what vaecf does) or by other weights of item i, on the
prepared splits of a `vaecf compare` run.

    python benchmarks/sparse_rank.py --data DIR/ml-latest-small/data [--seeds 98765,1,2,3,4]
        [--l2 100] [--p 0.2] [--k 256] [--popular-share 0.02] [--rank count,cosine,ridge]

Ranks (for item j's column, candidates i): count G_ij; cosine G_ij / sqrt(G_ii); ridge
G_ij / (G_ii + Lambda_i), item i's coefficient were it j's only neighbour.
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
import torch
from linear_select_cv import load_split

import vaecf.models.neighbourhood as nb
from vaecf.data.matrix import CSR
from vaecf.models.ease import _metrics_of, linear_weights

PACKAGE_RANKS = nb.rank_weights


def ranks(a: argparse.Namespace):
    """The package's ranks, and "ridge": 1 / (G_ii + Lambda_i) at the script's lambda, p."""

    def rank_weights(name: str, diag: np.ndarray) -> np.ndarray:
        if name == "ridge":
            return 1.0 / (diag + a.l2 + a.p / (1 - a.p) * diag)
        return PACKAGE_RANKS(name, diag)

    return rank_weights


def one_split(path: str, a: argparse.Namespace) -> dict:
    _, _, test, x = load_split(path)
    x = x.astype(np.float32)
    gram = (x.T @ x).tocsr()
    n = gram.shape[0]
    test = tuple(CSR.from_scipy(m) for m in test)
    dense = linear_weights(torch.from_numpy(gram.toarray()), a.l2, a.p).float()
    out = {"dense": _metrics_of(dense, *test)["ndcg@100"]}
    del dense
    for name in a.rank.split(","):
        nb.rank_weights = ranks(a)
        try:
            ip, ix, v = nb.neighbour_weights(
                x, a.l2, a.p, a.k, torch.device("cpu"), gram=gram,
                popular_share=a.popular_share, popular_k=1024, rank=name,
            )  # fmt: skip
        finally:
            nb.rank_weights = PACKAGE_RANKS
        b = sp.csr_matrix((v.numpy(), ix.numpy(), ip.numpy()), shape=(n, n))
        out[name] = _metrics_of(torch.from_numpy(b.toarray()), *test)["ndcg@100"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a compare run's data directory")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    ap.add_argument("--l2", type=float, default=100.0)
    ap.add_argument("--p", type=float, default=0.2)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--popular-share", type=float, default=0.02)
    ap.add_argument("--rank", default="count,cosine,ridge")
    a = ap.parse_args()
    res: dict[str, list[float]] = {}
    for s in a.seeds.split(","):
        out = one_split(f"{a.data}/seed-{s}", a)
        print(f"seed {s}: " + " ".join(f"{k} {v:.4f}" for k, v in out.items()), flush=True)
        for k, v in out.items():
            res.setdefault(k, []).append(v)
    base = np.mean(res["dense"])
    print(
        "mean: "
        + " ".join(f"{k} {np.mean(v):.4f} ({np.mean(v) - base:+.4f})" for k, v in res.items())
    )


if __name__ == "__main__":
    main()
