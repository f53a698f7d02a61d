"""Probe: where a batch-1 int8 answer's time goes, stage by stage, in the order an answer runs.

An ML-20M-sized Mult-VAE (20,108 items) as `vaecf bench infer --precision int8` serves it; 3,000
answers of one synthetic history each, the first 300 dropped. MODE (environment): "full" (the
answer), or the output layer fed a fixed input with, between answers, nothing ("nolatent"), a
0.4 ms sleep ("sleep"), a 1 MiB read ("mem"), or two small fp32 layers ("mlp").

    OMP_NUM_THREADS=2 MODE=full python benchmarks/probe_int8_stages.py
"""

import os
import statistics
import time

import torch
import torch.nn.functional as F

from vaecf import models
from vaecf.bench import synthetic_csr
from vaecf.data.matrix import CSR
from vaecf.models.serving import serving_copy
from vaecf.runtime import tune_cpu_allocator

tune_cpu_allocator()
torch.manual_seed(0)
net, scorer = serving_copy(models.build("multvae", 20108), "int8")
csr = CSR.from_scipy(synthetic_csr(400, 20108, 400 * 50, seed=1), "cpu")
out = net.decoder[-1]
MODE = os.environ.get("MODE", "full")
h0 = torch.randn(1, 600) * 0.02
junk = torch.randn(1 << 18)  # 1 MiB
x600, wa, ba = torch.randn(1, 600), torch.randn(200, 600), torch.randn(200)
wb, bb = torch.randn(600, 200), torch.randn(600)
names = ["batch", "latent", "dec_hidden", "output", "mask", "topk"]
times = {k: [] for k in [*names, "total"]}
pc = time.perf_counter
with torch.inference_mode():
    for i in range(3000):
        t0 = pc()
        batch = csr.batch(torch.arange(i, i + 1) % csr.n_rows)
        t1 = pc()
        if MODE == "sleep":
            time.sleep(0.0004)
        elif MODE == "mem":
            junk.sum()
        elif MODE == "mlp":
            torch.tanh(F.linear(torch.tanh(F.linear(x600, wa, ba)), wb, bb))
        z = net.latent_mean(batch) if MODE == "full" else None
        t2 = pc()
        h = net.decode_hidden(z) if z is not None else h0
        t3 = pc()
        s = out(h).float()
        t4 = pc()
        s[batch.row_ids, batch.indices] = -torch.inf
        t5 = pc()
        s.topk(100, dim=1)
        t6 = pc()
        if i >= 300:
            for k, a, b in zip(names, [t0, t1, t2, t3, t4, t5], [t1, t2, t3, t4, t5, t6]):
                times[k].append(b - a)
            times["total"].append(t6 - t0)
for k, v in times.items():
    v.sort()
    p99 = v[int(len(v) * 0.99)]
    print(
        f"{MODE} {k:11s} mean {1e3 * statistics.mean(v):.3f} p50 {1e3 * v[len(v) // 2]:.3f} "
        f"p99 {1e3 * p99:.3f} ms"
    )
