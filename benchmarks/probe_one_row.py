"""Probe: a batch-1 answer of an ML-20M-sized Mult-VAE with its small layers in numpy
(models/onerow.py) against PyTorch, in one process, in alternating blocks of 150 answers."""

import argparse
import statistics
import time

import torch

from vaecf import models
from vaecf.bench import machine, synthetic_csr
from vaecf.data.matrix import CSR
from vaecf.models.multvae import Scorer
from vaecf.models.serving import serving_copy
from vaecf.runtime import tune_cpu_allocator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--blocks", type=int, default=40)
    args = ap.parse_args()
    tune_cpu_allocator()
    torch.manual_seed(0)
    net, _ = serving_copy(models.build("multvae", 20108), args.precision)
    numpy_path, torch_path = Scorer(net), Scorer(net)
    torch_path.one_row = None
    csr = CSR.from_scipy(synthetic_csr(4096, 20108, 4096 * 50, seed=1))
    times = {"torch": [], "numpy": []}
    n = 0
    with torch.inference_mode():
        for block in range(args.blocks):
            for name, scorer in (("torch", torch_path), ("numpy", numpy_path)):
                for _ in range(150):
                    rows = torch.arange(n, n + 1) % csr.n_rows
                    n += 1
                    t0 = time.perf_counter()
                    batch = csr.batch(rows)
                    s = scorer(batch)
                    s[batch.row_ids, batch.indices] = -torch.inf
                    s.topk(100, dim=1)
                    if block:  # the first block of each warms up
                        times[name].append(time.perf_counter() - t0)
    print(machine())
    print(f"{'path':8s} {'mean ms':>8s} {'p50':>7s} {'p99':>7s}")
    for name, ts in times.items():
        ts.sort()
        print(
            f"{name:8s} {statistics.mean(ts) * 1e3:8.3f} {ts[len(ts) // 2] * 1e3:7.3f} "
            f"{ts[int(len(ts) * 0.99)] * 1e3:7.3f}"
        )


if __name__ == "__main__":
    main()
