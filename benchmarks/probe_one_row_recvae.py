"""Probe: a batch-1 answer of an ML-20M-sized RecVAE with its encoder in numpy
(models/onerow.py) against PyTorch, in one process, alternating blocks of 150 answers."""

import statistics
import sys
import time

import torch

from vaecf import models
from vaecf.bench import machine, synthetic_csr
from vaecf.data.matrix import CSR
from vaecf.models.base import Model
from vaecf.models.serving import serving_copy
from vaecf.runtime import tune_cpu_allocator

tune_cpu_allocator()
torch.manual_seed(0)
net, numpy_path = serving_copy(models.build("recvae", 20108), sys.argv[1])
torch_path = Model.scorer(net, "fp32")
csr = CSR.from_scipy(synthetic_csr(4096, 20108, 4096 * 50, seed=1))
times = {"torch": [], "numpy": []}
n = 0
with torch.inference_mode():
    for block in range(30):
        for name, sc in (("torch", torch_path), ("numpy", numpy_path)):
            for _ in range(150):
                rows = torch.arange(n, n + 1) % csr.n_rows
                n += 1
                t0 = time.perf_counter()
                b = csr.batch(rows)
                s = sc(b).float()
                s[b.row_ids, b.indices] = -torch.inf
                s.topk(100, dim=1)
                if block:
                    times[name].append(time.perf_counter() - t0)
print(machine(), "RecVAE", sys.argv[1])
for k, ts in times.items():
    ts.sort()
    mean, p50, p99 = statistics.mean(ts), ts[len(ts) // 2], ts[int(len(ts) * 0.99)]
    print(f"{k:6s} mean {mean * 1e3:.3f} p50 {p50 * 1e3:.3f} p99 {p99 * 1e3:.3f}")
