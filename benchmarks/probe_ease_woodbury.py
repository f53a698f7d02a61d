"""Probe: can an EASE update skip X^T X and the solve by updating the run's inverse with the
rows that changed (Woodbury), on ML-1M by time, 80% -> all?

P = (X^T X + lambda I)^-1 is recovered from the run's B alone: B = -P / diag(P) off the
diagonal, so P = (I - B) diag(d), with d_i = 1 / (lambda + G_ii - (G B)_ii) from the older rows
X (G B = X^T (X B): one sparse-dense product, no Gram). The rows the run's X^T X holds (the
training users', and the held-out users' fold-in rows where it adds them), compared as item
sets: those only in the newer data are added, those only in the older removed (a grown history
is both). New items join P at 1 / lambda (no older row holds them). P is then updated by the
added rows (P -= V^T V, V = L^-1 U P, L L^T = I + U P U^T) and by the removed ones (the same
with the signs turned), float32, and compared with the direct solve on the newer rows: time,
B's largest change, the top 100's agreement on 500 users.

    python benchmarks/probe_ease_woodbury.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import update as update_bench  # noqa: E402

import vaecf  # noqa: E402
from vaecf import rundir  # noqa: E402
from vaecf.bench import hardware  # noqa: E402
from vaecf.models.linear import linear_weights  # noqa: E402


def gram_rows(ds, fold_in: bool) -> sp.csr_matrix:
    """The rows EASE's X^T X holds: training rows, then (`fold_in`) the held-out users'
    fold-in rows."""
    parts = [ds.split(s) for s in ("train", *(("validation_tr", "test_tr") if fold_in else ()))]
    return sp.vstack(parts).tocsr().astype(np.float32)


def row_sets(x: sp.csr_matrix, cols: np.ndarray) -> Counter:
    """Each row's items (as column positions `cols` of x's columns), a multiset of rows."""
    return Counter(
        tuple(sorted(cols[x.indices[x.indptr[i] : x.indptr[i + 1]]].tolist()))
        for i in range(x.shape[0])
    )


def as_rows(rows: list[tuple], n: int) -> sp.csr_matrix:
    cols = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]) if rows else []
    owner = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    return sp.csr_matrix((np.ones(len(cols), np.float32), (owner, cols)), shape=(len(rows), n))


def low_rank(p: torch.Tensor, u: sp.csr_matrix, sign: float) -> None:
    """p <- (p^-1 + sign U^T U)^-1 in place, for the rows U (sign -1: rows taken out)."""
    if not u.shape[0]:
        return
    w = torch.from_numpy(np.asarray(u @ p.numpy()))  # U P (r, n); P is symmetric
    s = torch.from_numpy(np.asarray(u @ w.numpy().T)).mul_(sign)
    s.diagonal().add_(1.0)  # I + sign U P U^T: positive definite either way
    v = torch.linalg.solve_triangular(torch.linalg.cholesky(s), w, upper=False)
    p.addmm_(v.T, v, alpha=-sign)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    p.add_argument("--source", type=Path, default=update_bench.ML1M, help="ML-1M ratings.dat")
    p.add_argument("--share", type=float, default=0.8, help="the older export's share (0.8)")
    a = p.parse_args()
    torch.set_num_threads(2)
    print(hardware.machine())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        df = update_bench.read(a.source)
        old = update_bench.prepared(df, a.share, tmp / "old")
        new = update_bench.prepared(df, 1.0, tmp / "new")
        vaecf.train(old, vaecf.TrainConfig(progress=False), tmp / "run", model="ease")
        cfg = json.loads((tmp / "run" / "config.json").read_text())["model"]["config"]
        l2, fold_in = cfg["l2"], cfg["fold_in_rows"]
        b_old = rundir.load_model(tmp / "run", "cpu")[0].weight.float()
        t0 = time.perf_counter()
        x_old, x_new = gram_rows(old, fold_in), gram_rows(new, fold_in)
        ids_new = list(new.items.ids)
        pos = {v: i for i, v in enumerate(ids_new)}
        for v in old.items.ids:  # items the newer data lost go last, decoupled by the end
            pos.setdefault(v, len(pos))
        n_all, n_new = len(pos), len(ids_new)
        to_all = np.asarray([pos[v] for v in old.items.ids])
        before, after = row_sets(x_old, to_all), row_sets(x_new, np.arange(n_new))
        added, removed = list((after - before).elements()), list((before - after).elements())
        t_diff = time.perf_counter() - t0
        gb = np.asarray(x_old.multiply(x_old @ b_old.numpy()).sum(axis=0)).ravel()
        d = 1.0 / (l2 + x_old.getnnz(axis=0) - gb)
        p_old = (torch.eye(len(to_all)) - b_old).mul_(torch.from_numpy(d).float())
        p_all = torch.zeros(n_all, n_all)
        p_all.diagonal().fill_(1.0 / l2)
        idx = torch.from_numpy(to_all)
        p_all[idx.unsqueeze(1), idx.unsqueeze(0)] = p_old
        t_recover = time.perf_counter() - t0 - t_diff
        low_rank(p_all, as_rows(added, n_all), 1.0)
        low_rank(p_all, as_rows(removed, n_all), -1.0)
        p_new = p_all[:n_new, :n_new]
        b = p_new / -p_new.diagonal()
        b.diagonal().zero_()
        t_wood = time.perf_counter() - t0
        t1 = time.perf_counter()
        b_direct = linear_weights(torch.from_numpy((x_new.T @ x_new).toarray()), l2)
        t_direct = time.perf_counter() - t1
    rows = x_new[:500]
    top = [torch.from_numpy(np.asarray(rows @ m.numpy())).topk(100).indices for m in (b, b_direct)]
    agree = np.mean([len(set(i.tolist()) & set(j.tolist())) / 100 for i, j in zip(*top)])
    change = (b - b_direct).abs().max().item() / b_direct.abs().max().item()
    print(f"lambda {l2:g}, fold-in rows {fold_in}; items {len(to_all):,} -> {n_new:,}; "
          f"X^T X rows added {len(added):,}, removed {len(removed):,}")  # fmt: skip
    print("| route | s | B's largest change / B's largest entry | top-100 agreement |")
    print("|---|---:|---:|---:|")
    print(f"| direct: X^T X and the solve | {t_direct:.3f} | 0 | 1.000 |")
    print(f"| Woodbury (diff {t_diff:.3f}, P recovered {t_recover:.3f}) | {t_wood:.3f} "
          f"| {change:.3f} | {agree:.3f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
