"""Probe: does OpenBLAS's idle spin after a scipy solve slow the PyTorch work that follows it?

One 3,000-item float32 Cholesky inverse (`spd_inverse`, scipy's LAPACK), then one (2,000 x
3,000) top-100 in PyTorch, right after the solve or after a 50 ms pause; 8 rounds, median ms.
Run it under each spin (`import vaecf` sets 20 unless the variable is set):

    OPENBLAS_THREAD_TIMEOUT=28 python benchmarks/probe_openblas_spin.py
    python benchmarks/probe_openblas_spin.py
"""

import os
import time

import numpy as np
import torch

from vaecf.hardware import machine
from vaecf.models.linear import spd_inverse

n = 3000
x = (torch.rand(n // 2, n, generator=torch.Generator().manual_seed(0)) < 0.02).float()
g = x.T @ x
g.diagonal().add_(100.0)
s = torch.randn(2000, n)
got = {"right after a solve": [], "50 ms after a solve": []}
for r in range(9):
    for when, rows in got.items():
        spd_inverse(g.clone(), 100.0)
        if when != "right after a solve":
            time.sleep(0.05)
        t0 = time.perf_counter()
        s.topk(100, dim=1)
        if r:  # the first round warms up
            rows.append(time.perf_counter() - t0)
print(f"OPENBLAS_THREAD_TIMEOUT {os.environ['OPENBLAS_THREAD_TIMEOUT']}; {machine()}")
for when, rows in got.items():
    print(f"top-100 {when}: {1e3 * np.median(rows):.1f} ms")
