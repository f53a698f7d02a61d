"""EASE at ML-20M's shape: seconds to fit B on 20,108 items (Gram matrix, Cholesky, inverse).

    python benchmarks/ease_scale.py [--items 20108] [--users 136677] [--nnz 10000000]
                                    [--l2 500] [--dtype float32]

The data is `vaecf.bench.synthetic_csr` (power-law items); the solve's cost depends only on the
item count. Prints the CPU, the thread count, the dtype and the phases' seconds.
"""

from __future__ import annotations

import argparse
import time

import torch

from vaecf import models
from vaecf.bench import ML20M, cpu_name, synthetic_csr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=ML20M["items"])
    ap.add_argument("--users", type=int, default=ML20M["users"])
    ap.add_argument("--nnz", type=int, default=ML20M["nnz"])
    ap.add_argument("--l2", type=float, default=500.0, help="lambda (Steck's for ML-20M: 500)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    a = ap.parse_args()
    t0 = time.perf_counter()
    x = synthetic_csr(a.users, a.items, a.nnz, seed=0)
    t_data = time.perf_counter() - t0
    model = models.build("ease", a.items, {"l2": a.l2, "solve_dtype": a.dtype})
    record = model.fit(x)
    print(
        f"EASE fit, {a.items:,} items, {x.shape[0]:,} users, {x.nnz:,} interactions, "
        f"lambda {a.l2:g}, {record['solve_dtype']} on {cpu_name()} ({torch.get_num_threads()} "
        f"threads); data generated in {t_data:.1f} s (not counted)"
    )
    print(f"{'gram s':>8s} {'solve s':>8s} {'total s':>8s}")
    solve = record["seconds"] - record["gram_seconds"]
    print(f"{record['gram_seconds']:8.1f} {solve:8.1f} {record['seconds']:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
