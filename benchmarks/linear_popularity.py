"""EDLAE's popularity penalty (and a user weighting) by direct dense solves on the prepared
splits of a `vaecf compare` run: for each (alpha, beta), lambda and p are chosen on the
validation users (as `vaecf train --model edlae` does) and the test NDCG@100 of that choice, and
of the best choice in hindsight (oracle), is averaged over the splits. Also the test NDCG@100
when beta is chosen on validation together with lambda and p, and (with --cv-folds) when beta
is chosen by K-fold cross-validation over the training users at the lambda and p chosen for
beta 0.

    python benchmarks/linear_popularity.py --data DIR/filmtrust/data [--alphas 0]
        [--betas 0,0.1,0.25] [--l2 10,30,100,300,1000,3000] [--p 0,0.2,0.33,0.5] [--cv-folds 3]

alpha weights each user's row of X by 1/|history|^alpha in X^T X (lambda scaled with it);
beta divides B's column j by item j's count in X^T X to the power beta. The Gram holds the
training rows and the held-out users' fold-in rows, as the linear models fit it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from linear_select_cv import floats, linear_b, load_split, ndcg, split_80_20


def one_split(path: Path, a) -> tuple[dict, float | None]:
    """{(alpha, l2, p, beta): (validation, test)} and the test NDCG@100 of beta chosen by CV."""
    train, val, test, x = load_split(path)
    n_hist = np.asarray(x.sum(1)).ravel()
    g0 = (x.T @ x).toarray()
    counts = np.maximum(np.diag(g0), 1.0)
    got = {}
    for alpha in a.alphas:
        g = (x.T @ sp.diags(n_hist**-alpha) @ x).toarray()
        scale = np.mean(np.diag(g)) / np.mean(np.diag(g0))  # lambda in the weighted units
        for l2 in a.l2:
            for p in a.p:
                b = linear_b(g, l2 * scale, p, "edlae", np.float32)
                for beta in a.betas:
                    bb = b / counts[None, :] ** beta
                    got[(alpha, l2, p, beta)] = (ndcg(*val, bb), ndcg(*test, bb))
    cv_test = None
    if a.cv_folds and 0.0 in a.alphas and 0.0 in a.betas:
        keys = [k for k in got if k[0] == 0.0 and k[3] == 0.0]
        _, l2, p, _ = max(keys, key=lambda k: got[k][0])
        rng = np.random.default_rng(0)
        fold_of = rng.integers(0, a.cv_folds, train.shape[0])
        cv = np.zeros(len(a.betas))
        for f in range(a.cv_folds):
            xf = train[fold_of == f]
            fin, fte = split_80_20(xf, rng)
            gf = g0 - (xf.T @ xf).toarray() + (fin.T @ fin).toarray()
            bf = linear_b(gf, l2, p, "edlae", np.float32)
            cv += [ndcg(fin, fte, bf / counts[None, :] ** beta) for beta in a.betas]
        beta = a.betas[int(np.argmax(cv))]
        cv_test = got[(0.0, l2, p, beta)][1]
    return got, cv_test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a compare run's data directory")
    ap.add_argument("--alphas", type=floats, default=[0.0])
    ap.add_argument("--betas", type=floats, default=[0.0, 0.1, 0.25])
    ap.add_argument("--l2", type=floats, default=[10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0])
    ap.add_argument("--p", type=floats, default=[0.0, 0.2, 0.33, 0.5])
    ap.add_argument("--cv-folds", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(2)
    splits, cvs = [], []
    for path in sorted(Path(a.data).glob("seed-*")):
        got, cv_test = one_split(path, a)
        splits.append(got)
        cvs.append(cv_test)
        print(path.name, "done", flush=True)

    def picked(keys, by: int) -> float:  # mean test NDCG@100 of the choice by `by`
        return float(np.mean([max((s[k] for k in keys), key=lambda v: v[by])[1] for s in splits]))

    print("\n| alpha | beta | lambda, p chosen on validation | oracle |\n|---:|---:|---:|---:|")
    for alpha in a.alphas:
        for beta in a.betas:
            keys = [k for k in splits[0] if k[0] == alpha and k[3] == beta]
            print(f"| {alpha:g} | {beta:g} | {picked(keys, 0):.4f} | {picked(keys, 1):.4f} |")
    for alpha in a.alphas:
        keys = [k for k in splits[0] if k[0] == alpha]
        print(f"alpha {alpha:g}, beta chosen on validation too: {picked(keys, 0):.4f}")
    if cvs and cvs[0] is not None:
        print(f"beta chosen by {a.cv_folds}-fold CV over the training users: {np.mean(cvs):.4f}")


if __name__ == "__main__":
    main()
