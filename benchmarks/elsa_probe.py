"""ELSA (a low-rank linear autoencoder, RecSys 2022) as a probe, not a vaecf model: test
NDCG@100 on the prepared splits of a `vaecf compare` run, at the epoch best on validation.

A (n_items x r), rows normalised to unit length (so diag(A A^T) = 1 and x (A A^T - I) never
scores an item from itself); scores x A A^T - x; loss: the squared distance between the
L2-normalised prediction and the L2-normalised input, per user; Adam, batches of 256 users
(training rows and the held-out users' fold-in rows, as the linear models' Gram holds).

    python benchmarks/elsa_probe.py --data DIR/filmtrust/data [--rank 256] [--lr 0.01]
        [--epochs 60] [--seeds 98765,1,2,3,4]
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.evaluate import evaluate_scores


def scorer(a: torch.Tensor, n: int):
    def score(batch):
        x = torch.zeros(batch.batch_size, n)
        x[batch.row_ids, batch.indices] = batch.values
        return (x @ a) @ a.T - x

    return score


def one_split(path: str, rank: int, lr: float, epochs: int) -> tuple[float, float, int]:
    torch.manual_seed(0)
    ds = PreparedDataset(path)
    rows = [ds.split("train"), ds.split("validation_tr"), ds.split("test_tr")]
    x = torch.from_numpy(sp.vstack(rows).toarray()).float()
    n = x.shape[1]
    a = torch.nn.Parameter(torch.nn.init.xavier_uniform_(torch.empty(n, rank)))
    opt = torch.optim.Adam([a], lr=lr)
    val = tuple(CSR.from_scipy(ds.split(m)) for m in ("validation_tr", "validation_te"))
    test = tuple(CSR.from_scipy(ds.split(m)) for m in ("test_tr", "test_te"))
    best = (-1.0, 0.0, 0)
    for epoch in range(epochs):
        for idx in torch.randperm(x.shape[0]).split(256):
            xb = x[idx]
            an = F.normalize(a, dim=1)
            pred = (xb @ an) @ an.T - xb
            loss = (F.normalize(pred, dim=1) - F.normalize(xb, dim=1)).pow(2).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            an = F.normalize(a, dim=1)
            v = evaluate_scores(scorer(an, n), *val)["ndcg@100"]
            if v > best[0]:
                best = (v, evaluate_scores(scorer(an, n), *test)["ndcg@100"], epoch)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a compare run's data directory")
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    a = ap.parse_args()
    tests = []
    for s in a.seeds.split(","):
        v, t, epoch = one_split(f"{a.data}/seed-{s}", a.rank, a.lr, a.epochs)
        print(f"seed {s}: best epoch {epoch}, validation {v:.4f}, test NDCG@100 {t:.4f}")
        tests.append(t)
    print(f"mean test NDCG@100 {np.mean(tests):.4f}")


if __name__ == "__main__":
    main()
