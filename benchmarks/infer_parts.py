"""Where a batch-1 answer's time goes: each part of `vaecf bench infer`'s request (slicing the
history, fold-in encoder, decoder hidden layer, output layer, masking the history, top-100)
timed alone, back to back, beside the whole answer, on a fresh ML-20M-sized Mult-VAE.

    python benchmarks/infer_parts.py [--precision int8] [--items 20108] [--calls 3000]

Each part runs `--calls` times after 300 untimed calls; p50 / mean / p99 in microseconds. The
parts alone run with warm caches: their sum falls short of the whole answer, in which the
output layer's weight pushes the rest out of the caches.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vaecf import bench, models
from vaecf.data.matrix import CSR
from vaecf.models.serving import serving_copy


def timed(fn, calls: int) -> str:
    for i in range(300):
        fn(i)
    ts = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    us = [t * 1e6 for t in ts]
    return f"{us[calls // 2]:8.0f} {statistics.mean(us):8.0f} {us[int(calls * 0.99)]:8.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--items", type=int, default=bench.ML20M["items"])
    ap.add_argument("--calls", type=int, default=3000)
    a = ap.parse_args()
    bench.tune_cpu_allocator()
    torch.manual_seed(0)
    net, scorer = serving_copy(models.build("multvae", a.items), a.precision)
    csr = CSR.from_scipy(bench.synthetic_csr(4000, a.items, 4000 * 50, seed=1))
    rows = [torch.tensor([i % csr.n_rows]) for i in range(400)]
    batches = [csr.batch(r) for r in rows]

    def whole(i):
        b = csr.batch(rows[i % 400])
        s = scorer(b).float()
        s[b.row_ids, b.indices] = -torch.inf
        return s.topk(100, dim=1).indices

    print(f"{bench.cpu_name()}; torch {torch.__version__}; {a.precision}, {a.items:,} items")
    print(f"{'part':28s} {'p50 us':>8s} {'mean us':>8s} {'p99 us':>8s}")
    with torch.inference_mode():
        mu = net.encode(batches[0])[0]
        h = net.decode_hidden(mu)
        s = scorer(batches[0]).float()
        parts = {
            "slice the history": lambda i: csr.batch(rows[i % 400]),
            "encoder (fold-in)": lambda i: net.encode(batches[i % 400]),
            "decoder hidden layer": lambda i: net.decode_hidden(mu),
            "output layer": lambda i: net.decoder[-1](h),
            "scores (the three above)": lambda i: scorer(batches[i % 400]),
            "mask the history": lambda i: s.index_put_(
                (batches[i % 400].row_ids, batches[i % 400].indices), torch.tensor(-torch.inf)
            ),
            "top-100": lambda i: s.topk(100, dim=1),
            "whole answer": whole,
        }
        for name, fn in parts.items():
            print(f"{name:28s} {timed(fn, a.calls)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
