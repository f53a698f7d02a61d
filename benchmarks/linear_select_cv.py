"""How much does choosing EDLAE's (lambda, p) on a few validation users cost? Test NDCG@100 of
the grid point chosen by the validation users (what `vaecf train --model edlae` does), by K-fold
cross-validation over the training users (each fold refitted without its users, who are then
scored 80/20 like held-out users), and by the test users themselves (an oracle: what a perfect
choice would give), on the prepared splits of a `vaecf compare` run. DLAE (`--emphasis none`)
too with `--families edlae,dlae`, and the family chosen each way.

    python benchmarks/linear_select_cv.py --data DIR/ml-latest-small/data [--folds 3]
        [--l2 30,100,300,1000] [--p 0,0.2,0.33,0.5] [--families edlae] [--float32]

DIR: a `vaecf compare --out DIR` directory (its data/seed-* splits). Dense solves, so catalogues
up to a few thousand items; float32 halves the time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import lapack

from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.evaluate import evaluate_scores


def floats(s: str) -> list[float]:
    return [float(v) for v in s.split(",")]


def load_split(path: Path):
    """A prepared split's training rows, (fold-in, target) of the validation and test users,
    and the rows the linear models' Gram holds: training plus both fold-ins (float64)."""
    ds = PreparedDataset(path)
    val = ds.split("validation_tr"), ds.split("validation_te")
    test = ds.split("test_tr"), ds.split("test_te")
    train = ds.split("train").astype(np.float64).tocsr()
    return train, val, test, sp.vstack([train, val[0], test[0]]).tocsr()


def linear_b(gram: np.ndarray, l2: float, p: float, family: str, dtype) -> np.ndarray:
    """EDLAE's B = I - P diagMat(1 / diag P) or DLAE's I - P Lambda, diagonal zeroed, with
    P = (G + Lambda)^-1, Lambda = l2 + p / (1 - p) diag(G) (Steck 2020)."""
    lam = l2 + (p / (1 - p)) * np.diag(gram)
    a = np.array(gram, dtype=dtype, order="F", copy=True)
    a[np.diag_indices_from(a)] += lam
    potrf, potri = (
        (lapack.spotrf, lapack.spotri) if dtype == np.float32 else (lapack.dpotrf, lapack.dpotri)
    )
    c, info = potrf(a, lower=1, overwrite_a=1, clean=0)
    if info:
        raise RuntimeError("not positive definite")
    inv, info = potri(c, lower=1, overwrite_c=1)
    inv = np.tril(inv) + np.tril(inv, -1).T
    b = -inv / np.diag(inv)[None, :] if family == "edlae" else -inv * lam[None, :]
    b[np.diag_indices_from(b)] = 0.0
    return b


def ndcg(fold_in: sp.csr_matrix, target: sp.csr_matrix, b: np.ndarray) -> float:
    bt = torch.from_numpy(b.astype(np.float32))

    def scores(batch):
        x = torch.zeros(batch.batch_size, bt.shape[0])
        x[batch.row_ids, batch.indices] = batch.values
        return x @ bt

    f32 = lambda m: CSR.from_scipy(m.tocsr().astype(np.float32))  # noqa: E731
    return evaluate_scores(scores, f32(fold_in), f32(target))["ndcg@100"]


def split_80_20(x: sp.csr_matrix, rng) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Each user's items (5 or more) split 80/20 at random, as the held-out users are."""
    rows, cols, keep = [], [], []
    for u in range(x.shape[0]):
        items = x.indices[x.indptr[u] : x.indptr[u + 1]]
        if len(items) >= 5:
            rows += [u] * len(items)
            cols += list(items)
            keep += list(rng.random(len(items)) >= 0.2)
    rows, cols, keep = np.array(rows), np.array(cols), np.array(keep, dtype=bool)
    part = lambda m: sp.csr_matrix(  # noqa: E731
        (np.ones(int(m.sum())), (rows[m], cols[m])), shape=x.shape
    )
    return part(keep), part(~keep)


def one_split(path: Path, a) -> dict:
    ds = PreparedDataset(path)
    x = ds.split("train").astype(np.float64).tocsr()
    val = ds.split("validation_tr"), ds.split("validation_te")
    test = ds.split("test_tr"), ds.split("test_te")
    gram = (x.T @ x).toarray()
    rng = np.random.default_rng(0)
    fold_of = rng.integers(0, a.folds, x.shape[0])
    folds = []
    for f in range(a.folds):
        xf = x[fold_of == f]
        folds.append((gram - (xf.T @ xf).toarray(), *split_80_20(xf, rng)))
    dtype = np.float32 if a.float32 else np.float64
    got = {}
    for family in a.families:
        for l2 in a.l2:
            for p in a.p:
                if family == "dlae" and p == 0.0:
                    continue
                b = linear_b(gram, l2, p, family, dtype)
                cv = [ndcg(fi, te, linear_b(g, l2, p, family, dtype)) for g, fi, te in folds]
                got[(family, l2, p)] = (ndcg(*val, b), float(np.mean(cv)), ndcg(*test, b))
    picks = {}
    groups = [(f,) for f in a.families] + ([tuple(a.families)] if len(a.families) > 1 else [])
    for fams in groups:
        keys = [k for k in got if k[0] in fams]
        for way, i in (("validation", 0), ("cv", 1), ("oracle", 2)):
            k = max(keys, key=lambda k: got[k][i])
            picks[f"{'+'.join(fams)} by {way}"] = (k, got[k][2])
    return picks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a compare run's data directory")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--l2", default="1,3,10,30,100,300,1000,3000")
    ap.add_argument("--p", default="0,0.1,0.2,0.33,0.5")
    ap.add_argument("--families", default="edlae,dlae")
    ap.add_argument("--float32", action="store_true")
    a = ap.parse_args()
    a.l2 = [float(v) for v in a.l2.split(",")]
    a.p = [float(v) for v in a.p.split(",")]
    a.families = a.families.split(",")
    rows = []
    for split in sorted(Path(a.data).glob("seed-*")):
        picks = one_split(split, a)
        rows.append(picks)
        print(split.name, {k: (v[0][1:], round(v[1], 4)) for k, v in picks.items()}, flush=True)
    print("\n| chosen | mean test NDCG@100 |\n|---|---:|")
    for k in rows[0]:
        print(f"| {k} | {np.mean([r[k][1] for r in rows]):.4f} |")


if __name__ == "__main__":
    main()
