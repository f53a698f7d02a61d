"""Higher-order EDLAE (pair features, Steck & Liang, RecSys 2021) on the prepared splits of a
`vaecf compare` run, against the plain model at the same lambda, p and popularity penalty.

Scores are X B + Z C, where Z holds pair features z_u(i,j) = x_ui x_uj for the `pairs` item
pairs of highest co-occurrence, and C (pairs x items) may not let a pair predict its own two
items. Fitted by alternating exact steps on
    ||X - X B - Z C||^2 + ||Lambda^(1/2) B||^2 + lambda_C ||C||^2,  diag(B) = 0, C masked,
the B step in closed form (EDLAE's Lambda = lambda + p/(1-p) diag(G), the zero diagonal by a
Lagrange multiplier per column), the C step by ADMM on the mask (rho), written from the
objective. lambda and p are chosen on validation over a grid with C = 0 (the plain model),
then (pairs, lambda_C) on validation with B and C fitted together; the penalty beta divides
both paths' column j by item j's count.

    python benchmarks/higher_order.py --data DIR/ml-latest-small/data [--pairs 1000,4000]
        [--lambda-c 10,100,1000] [--iters 20]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from linear_select_cv import floats, linear_b, load_split

from vaecf.data.matrix import CSR
from vaecf.evaluate import evaluate_scores


def pair_list(gram: np.ndarray, m: int) -> np.ndarray:
    """(m, 2) the item pairs i < j of highest co-occurrence (ties: lower index first)."""
    iu, ju = np.triu_indices(gram.shape[0], 1)
    vals = gram[iu, ju]
    top = np.argsort(-vals, kind="stable")[:m]
    return np.stack([iu[top], ju[top]], 1)


def pair_features(x: sp.csr_matrix, pairs: np.ndarray) -> sp.csr_matrix:
    """Z: (users, pairs) x_ui x_uj."""
    xc = x.tocsc()
    z = xc[:, pairs[:, 0]].multiply(xc[:, pairs[:, 1]])
    return sp.csr_matrix(z)


def fit_higher(g, lam, zx, zz, pairs, lam_c, rho, iters):
    """B (items x items) and C (pairs x items) by alternating the exact B step and ADMM on C."""
    n, m = g.shape[0], len(pairs)
    a = g + np.diag(lam)
    p_b = np.linalg.inv(a)
    q = np.linalg.inv(zz + (lam_c + rho) * np.eye(m))
    mask = np.ones((m, n))
    mask[np.arange(m), pairs[:, 0]] = 0.0
    mask[np.arange(m), pairs[:, 1]] = 0.0
    d = np.zeros((m, n))
    u = np.zeros((m, n))
    for _ in range(iters):
        b = p_b @ (g - zx.T @ d)
        b -= p_b * (np.diag(b) / np.diag(p_b))[None, :]
        c = q @ (zx - zx @ b + rho * (d - u))
        d = mask * (c + u)
        u += c - d
    return b, d


def ndcg(fold_in, target, b, c=None, pairs=None, counts=None, beta=0.0):
    bt = torch.from_numpy(b.astype(np.float32))
    ct = None if c is None else torch.from_numpy(c.astype(np.float32))
    scale = torch.from_numpy((counts**-beta).astype(np.float32))

    def scores(batch):
        x = torch.zeros(batch.batch_size, bt.shape[0])
        x[batch.row_ids, batch.indices] = batch.values
        s = x @ bt
        if ct is not None:
            z = x[:, pairs[:, 0]] * x[:, pairs[:, 1]]
            s = s + z @ ct
        return s * scale

    f32 = lambda mat: CSR.from_scipy(mat.tocsr().astype(np.float32))  # noqa: E731
    return evaluate_scores(scores, f32(fold_in), f32(target))["ndcg@100"]


def one_split(path: Path, a) -> dict:
    train, val, test, x = load_split(path)
    g = (x.T @ x).toarray()
    counts = np.maximum(np.diag(g), 1.0)
    best = None
    for l2 in a.l2:
        for p in a.p:
            b = linear_b(g, l2, p, "edlae", np.float64)
            v = ndcg(*val, b, counts=counts, beta=a.beta)
            if best is None or v > best[0]:
                best = (v, l2, p, b)
    v0, l2, p, b0 = best
    t0 = ndcg(*test, b0, counts=counts, beta=a.beta)
    out = {"plain": (v0, t0, l2, p)}
    lam = l2 + (p / (1 - p)) * np.diag(g)
    for m in a.pairs:
        pairs = pair_list(g, m)
        z = pair_features(x, pairs)
        zx = (z.T @ x).toarray()
        zz = (z.T @ z).toarray()
        for lam_c in a.lambda_c:
            t = time.perf_counter()
            b, c = fit_higher(g, lam, zx, zz, pairs, lam_c, a.rho, a.iters)
            args = dict(c=c, pairs=pairs, counts=counts, beta=a.beta)
            v, te = ndcg(*val, b, **args), ndcg(*test, b, **args)
            out[(m, lam_c)] = (v, te, time.perf_counter() - t)
            print(f"  pairs {m} lambda_C {lam_c:g}: validation {v:.4f} test {te:.4f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a compare run's data directory")
    ap.add_argument("--l2", type=floats, default=floats("30,100,300,1000,3000"))
    ap.add_argument("--p", type=floats, default=floats("0,0.1,0.2,0.33,0.5"))
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--pairs", type=lambda s: [int(v) for v in s.split(",")], default=[1000, 4000])
    ap.add_argument("--lambda-c", type=floats, default=floats("10,100,1000"))
    ap.add_argument("--rho", type=float, default=1000.0)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    for path in sorted(a.data.glob("seed-*")):
        print(path.name, flush=True)
        got = one_split(path, a)
        v0, t0, l2, p = got.pop("plain")
        key = max(got, key=lambda k: got[k][0])
        rows.append((path.name, l2, p, v0, t0, key, got[key][0], got[key][1]))
        v, t = got[key][:2]
        print(f"  plain (lambda {l2:g}, p {p:g}): validation {v0:.4f} test {t0:.4f}; "
              f"picked {key}: validation {v:.4f} test {t:.4f}", flush=True)  # fmt: skip
    print("\n| split | lambda, p | plain val | plain test | picked (pairs, lambda_C) "
          "| higher val | higher test | diff |")  # fmt: skip
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for name, l2, p, v0, t0, key, v, t in rows:
        print(f"| {name} | {l2:g}, {p:g} | {v0:.4f} | {t0:.4f} | {key} | {v:.4f} | {t:.4f} "
              f"| {t - t0:+.4f} |")  # fmt: skip
    d = np.array([r[7] - r[4] for r in rows])
    print(f"\nmean test: plain {np.mean([r[4] for r in rows]):.4f}, higher-order "
          f"{np.mean([r[7] for r in rows]):.4f}, diff {d.mean():+.4f} "
          f"({(d > 0).sum()} of {len(d)} splits up)")  # fmt: skip


if __name__ == "__main__":
    main()
