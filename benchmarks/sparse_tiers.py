"""The sparse solver with wider neighbourhoods for the most popular items: test NDCG@100 at a
fixed (lambda, p), no popularity penalty, on the prepared splits of a `vaecf compare` run.

For each split: the dense solve; the sparse solve with 256 and with 1,024 neighbours for every
item; and B with the columns of the `share` most popular items (largest count in X^T X) taken
from the 1,024 solve and the rest from the 256 one, which is what `--popular-share share
--popular-neighbours 1024` computes (tests/test_models.py checks that equality).

    python benchmarks/sparse_tiers.py --data DIR/ml-latest-small/data [--seeds 98765,1,2,3,4]
        [--l2 100] [--p 0.2] [--shares 0.02,0.05,0.1,0.2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
import torch
from linear_select_cv import load_split

from vaecf.data.matrix import CSR
from vaecf.models.ease import _metrics_of, linear_weights
from vaecf.models.neighbourhood import neighbour_weights, popular_tier


def one_split(path: str, l2: float, p: float, shares: list[float]) -> tuple[dict, str]:
    cpu = torch.device("cpu")
    _, _, test, x = load_split(path)
    x = x.astype(np.float32)
    gram = (x.T @ x).tocsr()
    test = tuple(CSR.from_scipy(m) for m in test)
    n = gram.shape[0]

    def ndcg(b) -> float:
        return _metrics_of(torch.from_numpy(b.toarray()), *test)["ndcg@100"]

    def solve(k):
        t0 = time.perf_counter()
        ip, ix, v = (t.numpy() for t in neighbour_weights(x, l2, p, k, cpu, gram=gram))
        return sp.csr_matrix((v, ix, ip), shape=(n, n)), time.perf_counter() - t0

    dense = linear_weights(torch.from_numpy(gram.toarray()), l2, p).float()
    out = {"dense": _metrics_of(dense, *test)["ndcg@100"]}
    del dense
    (b256, t256), (b1k, t1k) = solve(256), solve(1024)
    out["256"], out["1024"] = ndcg(b256), ndcg(b1k)
    for share in shares:
        top = np.zeros(n, np.float32)
        top[popular_tier(gram.diagonal(), share)] = 1.0
        out[f"{share:g}"] = ndcg(b256 @ sp.diags(1.0 - top) + b1k @ sp.diags(top))
    return out, f"(256: {t256:.0f} s, 1024: {t1k:.0f} s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a compare run's data directory")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    ap.add_argument("--l2", type=float, default=100.0)
    ap.add_argument("--p", type=float, default=0.2)
    ap.add_argument("--shares", default="0.02,0.05,0.1,0.2")
    a = ap.parse_args()
    shares = [float(v) for v in a.shares.split(",")]
    res: dict[str, list[float]] = {}
    for s in a.seeds.split(","):
        out, times = one_split(f"{a.data}/seed-{s}", a.l2, a.p, shares)
        row = " ".join(f"{k} {v:.4f}" for k, v in out.items())
        print(f"seed {s}: {row}  {times}", flush=True)
        for k, v in out.items():
            res.setdefault(k, []).append(v)
    print("mean: " + " ".join(f"{k} {np.mean(v):.4f}" for k, v in res.items()))


if __name__ == "__main__":
    main()
