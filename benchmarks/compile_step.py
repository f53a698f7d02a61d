"""Does `torch.compile` (Inductor) speed up vaecf's Mult-VAE training step on a CPU? The loss
(encoder, sampling, the fused output layer and multinomial NLL, KL) compiled with dynamic shapes
against the eager step, in turn, on the ML-20M shape at batch 500; users/s is the median of the
timed steps, the first step's seconds include the compilation.

    python benchmarks/compile_step.py [--precision bf16] [--steps 12] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vaecf import bench, models
from vaecf import precision as prec
from vaecf.data.matrix import CSR
from vaecf.runtime import tune_cpu_allocator


def run(csr, batches, precision: str, compiled: bool, warm: int = 3) -> tuple[float, float]:
    torch.manual_seed(0)
    net = models.build("multvae", csr.shape[1]).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
    loss_fn = torch.compile(net.loss, dynamic=True) if compiled else net.loss
    dev, first, times = torch.device("cpu"), 0.0, []
    for i, rows in enumerate(batches):
        t0 = time.perf_counter()
        with prec.autocast(dev, precision):
            loss, _ = loss_fn(csr.batch(rows), 0.2, rows.numel())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        first = dt if i == 0 else first
        if i >= warm:
            times.append(dt)
    return rows.numel() / statistics.median(times), first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    tune_cpu_allocator()
    m = bench.synthetic_csr(bench.ML20M["users"], bench.ML20M["items"], bench.ML20M["nnz"])
    csr = CSR.from_scipy(m)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, m.shape[0], (500,), generator=gen) for _ in range(a.steps + 3)]
    print(f"{bench.cpu_name()}, torch {torch.__version__}, {a.precision}, batch 500")
    for r in range(a.rounds):
        for compiled in (False, True):
            ups, first = run(csr, batches, a.precision, compiled)
            name = "compiled" if compiled else "eager"
            print(f"round {r} {name:8s} {ups:7.0f} users/s  first step {first:5.1f} s", flush=True)


if __name__ == "__main__":
    main()
