"""EDLAE on a user-weighted Gram, X^T diag(|u|^-a) X (each history's weight falling with its
length), against a = 0 (EDLAE as vaecf fits it): test NDCG@100 of the (lambda, p) chosen on the
validation users, and of the best grid point by the test users (an oracle), per split of a
`vaecf compare` run. Penalty beta 0.1 as vaecf's default; lambda in unweighted units (scaled by
the weighted Gram's mean diagonal). Dense float64 solves: catalogues of a few thousand items.

    python benchmarks/linear_user_weights.py --data DIR/filmtrust/data [--alphas 0,0.25,0.5,1]
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
import torch
from linear_select_cv import load_split

from vaecf.data.matrix import CSR
from vaecf.models.ease import _beta_metrics, linear_weights

L2 = [3, 10, 30, 100, 300, 1000, 3000]
PS = [0.0, 0.1, 0.2, 0.33, 0.5]
BETA = 0.1


def one_split(path: str, alphas: list[float]) -> dict[float, tuple[float, float]]:
    _, val, test, x = load_split(path)
    val, test = (tuple(CSR.from_scipy(m) for m in pair) for pair in (val, test))
    counts = torch.from_numpy(np.asarray((x.T @ x).diagonal()))
    lens = np.diff(x.indptr).astype(np.float64)
    out = {}
    for a in alphas:
        xw = sp.diags(lens ** (-a / 2)) @ x
        g = torch.from_numpy((xw.T @ xw).toarray())
        scale = g.diagonal().mean().item() / counts.mean().item()
        rows = []
        for l2 in L2:
            for p in PS:
                b = linear_weights(g, l2 * scale, p)
                v = _beta_metrics(b, counts, [BETA], *val)[0]["ndcg@100"]
                t = _beta_metrics(b, counts, [BETA], *test)[0]["ndcg@100"]
                rows.append((v, t))
        out[a] = (max(rows)[1], max(t for _, t in rows))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a compare run's data directory")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    ap.add_argument("--alphas", default="0,0.25,0.5,1")
    a = ap.parse_args()
    alphas = [float(v) for v in a.alphas.split(",")]
    res: dict[float, list] = {al: [] for al in alphas}
    for s in a.seeds.split(","):
        out = one_split(f"{a.data}/seed-{s}", alphas)
        print(
            f"seed {s}: "
            + "  ".join(f"a {k:g} {v:.4f} (oracle {o:.4f})" for k, (v, o) in out.items()),
            flush=True,
        )  # noqa: E501
        for k, r in out.items():
            res[k].append(r)
    for k, r in res.items():
        by_val, oracle = (np.mean([t[i] for t in r]) for i in (0, 1))
        print(f"a {k:g}: by validation {by_val:.4f}, oracle {oracle:.4f}")


if __name__ == "__main__":
    main()
