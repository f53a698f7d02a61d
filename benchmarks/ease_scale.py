"""EASE at ML-20M's shape: seconds to fit B on 20,108 items (Gram matrix, Cholesky, inverse).

    python benchmarks/ease_scale.py [--items 20108] [--users 136677] [--nnz 10000000]
                                    [--l2 500] [--dtype float32]
                                    [--model ease|edlae] [--device cuda]
                                    [--solver auto|dense|sparse]

The data is `vaecf.bench.speed.synthetic_csr` (power-law items); the solve's cost depends only
on the item count. Prints the CPU, the thread count, the dtype and the phases' seconds.
"""

from __future__ import annotations

import argparse
import time

import torch

from vaecf import models
from vaecf.bench.hardware import device_name
from vaecf.bench.speed import add_shape_arguments, synthetic_csr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(ap)
    ap.add_argument("--l2", type=float, default=500.0, help="lambda (Steck's for ML-20M: 500)")
    ap.add_argument("--dropout", type=float, default=0.33, help="EDLAE's p (Steck's ML-20M: 0.33)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--model", default="ease", choices=["ease", "edlae"])
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    ap.add_argument("--solver", default="auto", choices=["auto", "dense", "sparse"])
    a = ap.parse_args()
    t0 = time.perf_counter()
    x = synthetic_csr(a.users, a.items, a.nnz, seed=0)
    t_data = time.perf_counter() - t0
    settings = {"solve_dtype": a.dtype, "l2": a.l2, "solver": a.solver}
    if a.model == "edlae":
        settings["dropout"] = a.dropout
    model = models.build(a.model, a.items, settings).to(a.device)
    t0 = time.perf_counter()
    record = model.fit(x)
    wall = time.perf_counter() - t0
    print(
        f"{a.model} fit, {a.items:,} items, {x.shape[0]:,} users, {x.nnz:,} interactions, "
        f"lambda {a.l2:g}{f', p {a.dropout:g}' if a.model == 'edlae' else ''}, "
        f"{record['solve_dtype']}, {record['solver']} solver on {device_name(a.device)} "
        f"({torch.get_num_threads()} CPU "
        f"threads); data generated in {t_data:.1f} s (not counted); wall {wall:.1f} s"
    )
    print(f"{'gram s':>8s} {'solve s':>8s} {'total s':>8s}")
    solve = record["seconds"] - record["gram_seconds"]
    print(f"{record['gram_seconds']:8.1f} {solve:8.1f} {record['seconds']:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
