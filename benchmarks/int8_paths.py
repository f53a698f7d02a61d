"""The int8 serving copy's ways to multiply, and where a batch-1 answer's time goes.

    python benchmarks/int8_paths.py [--items 20108] [--n 1000]
    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/int8_paths.py    # oneDNN without VNNI/AVX-512

1. The output layer (600 -> n_items) through each path of `Int8Linear` (int8 x int8, the
   weight-only kernel, dequantized blocks) at batch 1, 16 and 64, on 2 threads and on 1; and a
   hidden layer (600 -> 400) at batch 1 in fp32 and bf16. Median microseconds of `--n` calls,
   each path called back to back (its weight stays in cache between calls).
2. A batch-1 answer of the int8 serving copy of an ML-20M-sized Mult-VAE (`vaecf bench infer`'s
   loop: slice the history, encode, decode, output layer, mask, top 100), each stage timed with
   perf_counter, p50 and p99 over `--n` answers. Here the output weight competes for the cache
   with the rest of the answer, as in a server.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from vaecf import bench, models
from vaecf.data.matrix import CSR
from vaecf.models.serving import Int8Linear, serving_copy
from vaecf.runtime import tune_cpu_allocator


def median_us(fn, n: int) -> float:
    for _ in range(max(10, n // 10)):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def layer_table(items: int, n: int) -> None:
    torch.manual_seed(0)
    q = Int8Linear(nn.Linear(600, items), torch.float32)
    print(f"output layer 600 -> {items}: paths chosen small={q.small}, large={q.large}")
    heads = " ".join(f"{f'batch {b} us':>12s}" for b in (1, 16, 64))
    print(f"{'path':8s} {'threads':>7s} {heads}")
    xs = [torch.tanh(torch.randn(b, 600)) for b in (1, 16, 64)]  # hidden-layer outputs
    with torch.inference_mode():
        for threads in (2, 1):
            torch.set_num_threads(threads)
            for path in ("int8", "kernel", "blocks"):
                fn = getattr(q, f"_{path}")
                us = [median_us(lambda x=x, fn=fn: fn(x), max(20, n // len(x))) for x in xs]
                print(f"{path:8s} {threads:7d} " + " ".join(f"{u:12.1f}" for u in us))
        torch.set_num_threads(2)
        x = torch.rand(1, 600)
        for dtype in (torch.float32, torch.bfloat16):
            lin, xd = nn.Linear(600, 400).to(dtype), x.to(dtype)
            us = median_us(lambda lin=lin, xd=xd: lin(xd), n)
            print(f"hidden layer 600 -> 400, batch 1, {str(dtype).split('.')[1]}: {us:.1f} us")


def stage_table(items: int, n: int) -> None:
    torch.manual_seed(0)
    net, _ = serving_copy(models.build("multvae", items), "int8")
    out = net.decoder[-1]
    csr = CSR.from_scipy(bench.synthetic_csr(4000, items, 4000 * 50, seed=1))
    names = ("slice history", "encoder", "decoder hidden", "output layer", "mask", "top 100")
    times: dict[str, list[float]] = {k: [] for k in names}
    with torch.inference_mode():
        for i in range(n + n // 5):
            t = [time.perf_counter()]
            batch = csr.batch(torch.arange(i, i + 1) % csr.n_rows)
            t.append(time.perf_counter())
            mu = net.encode(batch)[0]
            t.append(time.perf_counter())
            h = net.decode_hidden(mu)
            t.append(time.perf_counter())
            s = out(h).float()
            t.append(time.perf_counter())
            s[batch.row_ids, batch.indices] = -torch.inf
            t.append(time.perf_counter())
            s.topk(100, dim=1)
            t.append(time.perf_counter())
            if i >= n // 5:  # warmed up
                for k, a, b in zip(names, t, t[1:]):
                    times[k].append((b - a) * 1e6)
    print(f"\nbatch-1 answer of the int8 copy ({items} items, histories of 50), us:")
    print(f"{'stage':16s} {'p50':>8s} {'p99':>8s}")
    for k, v in times.items():
        v.sort()
        print(f"{k:16s} {v[len(v) // 2]:8.1f} {v[int(len(v) * 0.99)]:8.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=bench.ML20M["items"])
    ap.add_argument("--n", type=int, default=1000, help="calls per figure")
    a = ap.parse_args()
    tune_cpu_allocator()
    print(f"{bench.cpu_name()}, torch {torch.__version__}")
    layer_table(a.items, a.n)
    stage_table(a.items, a.n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
