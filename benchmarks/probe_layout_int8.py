"""Probe: inf-AE's first layer by the layout of users_t, and where a batch-1 int8 answer goes.

(a) `first_layer.product` of 2,000 histories (~60 items each) with a 10,000 x 10,000 users_t,
column-major (as scipy's transpose gave it) and row-major; (b) an ML-20M-sized Mult-VAE's int8
copy at batch 1: the output layer alone, the whole score, and score + mask + top 100 (mean and
p99 ms over 360 calls after 40 warm-ups).

    OMP_NUM_THREADS=2 python benchmarks/probe_layout_int8.py
"""

import statistics
import time

import numpy as np
import torch

from vaecf import models
from vaecf.bench import machine, synthetic_csr
from vaecf.data.matrix import CSR
from vaecf.models import first_layer
from vaecf.models.serving import serving_copy


def timed(fn, n=400):
    ts = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t)
    ts = sorted(ts[40:])
    return f"{statistics.mean(ts) * 1e3:.3f} / {ts[int(len(ts) * 0.99)] * 1e3:.3f}"


def main() -> None:
    print(machine())
    rng = np.random.default_rng(0)
    users_t = torch.from_numpy((rng.random((10_000, 10_000)) < 0.006).astype(np.float32))
    batch = CSR.from_scipy(synthetic_csr(2000, 10_000, 120_000, seed=1)).batch(torch.arange(2000))
    for name, w in (("column-major", users_t.T.contiguous().T), ("row-major", users_t)):
        t = time.perf_counter()
        first_layer.product(batch, w, batch.values)
        print(f"(a) {name}: {time.perf_counter() - t:.2f} s")
    torch.manual_seed(0)
    net, scorer = serving_copy(models.build("multvae", 20108), "int8")
    layer = net.decoder[-1]
    csr = CSR.from_scipy(synthetic_csr(400, 20108, 20000, seed=1))
    x = torch.tanh(torch.randn(1, 600))

    def full(i):
        b = csr.batch(torch.tensor([i % 400]))
        s = scorer(b).float()
        s[b.row_ids, b.indices] = -torch.inf
        s.topk(100, dim=1)

    with torch.inference_mode():
        print(f"(b) path {layer.small}; mean / p99 ms")
        print("    output layer", timed(lambda i: layer(x)))
        print("    score", timed(lambda i: scorer(csr.batch(torch.tensor([i % 400])))))
        print("    score + mask + top 100", timed(full))


if __name__ == "__main__":
    main()
