"""Probe: where a batch-1 answer of an ML-20M-sized Mult-VAE goes once its small layers run in
numpy (models/onerow.py): mean ms of each stage over 5,500 answers."""

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

STAGES = ["slice", "numpy layers", "output layer", "mask", "top 100"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--precision", default="int8")
    args = ap.parse_args()
    tune_cpu_allocator()
    torch.manual_seed(0)
    net, _ = serving_copy(models.build("multvae", 20108), args.precision)
    sc, out = Scorer(net), net.decoder[-1]
    csr = CSR.from_scipy(synthetic_csr(4096, 20108, 4096 * 50, seed=1))
    acc = {k: [] for k in STAGES}
    pc = time.perf_counter
    with torch.inference_mode():
        for n in range(6000):
            rows = torch.arange(n, n + 1) % csr.n_rows
            t = [pc()]
            b = csr.batch(rows)
            t.append(pc())
            h = sc.one_row(b.indices, b.values)
            t.append(pc())
            s = out(h) if sc.weight_t is None else torch.addmm(sc.bias, h, sc.weight_t)
            t.append(pc())
            s[b.row_ids, b.indices] = -torch.inf
            t.append(pc())
            s.topk(100, dim=1)
            t.append(pc())
            if n >= 500:
                for i, k in enumerate(STAGES):
                    acc[k].append(t[i + 1] - t[i])
    print(machine(), args.precision)
    for k in STAGES:
        print(f"{k:14s} {statistics.mean(acc[k]) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
