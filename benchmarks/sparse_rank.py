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

COUNT_NEIGHBOURS = nb.neighbours_of


def rank_weights(name: str, diag: np.ndarray, lam: np.ndarray) -> np.ndarray:
    return {
        "count": np.ones_like(diag),
        "cosine": 1.0 / np.sqrt(np.maximum(diag, 1.0)),
        "ridge": 1.0 / (diag + lam),
    }[name]


def one_split(path: str, a: argparse.Namespace) -> dict:
    _, _, test, x = load_split(path)
    x = x.astype(np.float32)
    gram = (x.T @ x).tocsr()
    n = gram.shape[0]
    test = tuple(CSR.from_scipy(m) for m in test)
    diag = gram.diagonal().astype(np.float64)
    lam = a.l2 + a.p / (1 - a.p) * diag
    dense = linear_weights(torch.from_numpy(gram.toarray()), a.l2, a.p).float()
    out = {"dense": _metrics_of(dense, *test)["ndcg@100"]}
    del dense
    for name in a.rank.split(","):
        scale = sp.diags(rank_weights(name, diag, lam))

        def ranked(g, k, items=None, scale=scale):  # column i of G scaled by item i's weight
            return COUNT_NEIGHBOURS((g @ scale).tocsr(), k, items)

        nb.neighbours_of = ranked
        try:
            ip, ix, v = nb.neighbour_weights(
                x, a.l2, a.p, a.k, torch.device("cpu"), gram=gram,
                popular_share=a.popular_share, popular_k=1024,
            )  # fmt: skip
        finally:
            nb.neighbours_of = COUNT_NEIGHBOURS
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
