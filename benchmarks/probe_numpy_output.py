"""Probe: a one-row fp32 answer with its output layer in numpy (OpenBLAS) against PyTorch's.

    python benchmarks/probe_numpy_output.py [--model multvae] [--blocks 40]

An ML-20M-sized model (random weights), fp32 on the CPU; answers as `vaecf bench infer` times
them (the history's batch, scores, seen items masked, top 100) to histories of the synthetic
ML-20M matrix, in alternating blocks of 150 per path, one process.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from vaecf import bench, hardware, models, roofline
from vaecf.data.matrix import CSR
from vaecf.models.multvae import Scorer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="multvae")
    ap.add_argument("--blocks", type=int, default=40)
    a = ap.parse_args()
    data = bench.synthetic_csr(20_000, bench.ML20M["items"], 1_500_000)
    csr = CSR.from_scipy(data)
    net = models.build(a.model, data.shape[1]).eval()
    scorer = Scorer(net)
    saved = scorer.one_row_out
    times = {"pytorch": [], "numpy": []}
    n = 0
    with torch.inference_mode():
        for blk in range(a.blocks):
            for path in ("pytorch", "numpy") if blk % 2 == 0 else ("numpy", "pytorch"):
                scorer.one_row_out = saved if path == "numpy" else None
                for _ in range(150):
                    rows = torch.tensor([n % csr.n_rows])
                    n += 1
                    t0 = time.perf_counter()
                    batch = csr.batch(rows)
                    scores = scorer(batch).float()
                    scores[batch.row_ids, batch.indices] = -torch.inf
                    scores.topk(100, dim=1)
                    times[path].append(time.perf_counter() - t0)
    read = roofline.output_layer_bytes(net) / roofline.read_bandwidth()
    print(f"| path | mean ms | p50 | p99 | p99 / read ({read * 1e3:.3f} ms) |")
    print("|---|---:|---:|---:|---:|")
    for path, t in times.items():
        ms = np.asarray(t[150:]) * 1e3
        p99 = np.percentile(ms, 99)
        print(f"| {path} | {ms.mean():.3f} | {np.percentile(ms, 50):.3f} | {p99:.3f} | "
              f"{p99 / (read * 1e3):.2f} |")  # fmt: skip
    print(f"{a.model}, {data.shape[1]} items, fp32; {hardware.machine()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
