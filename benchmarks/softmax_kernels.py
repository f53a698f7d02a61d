"""Training steps with the fused layer's softmax as Triton kernels and as PyTorch's, side by side.

    python benchmarks/softmax_kernels.py [--device cuda] [--batch-size 500 --batch-size 24576]
                                         [--precision bf16] [--steps 30] [--rounds 2]

`vaecf bench train`'s steps (ML-20M shape, Mult-VAE, CUDA graphs where training uses them) with
`fused.USE_KERNELS` off and on in turn, `--rounds` times, in one process; users/s and ms a step
(the median round). On a machine where the kernels cannot run (no Triton, no GPU) both columns
time PyTorch's path.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from vaecf.bench import hardware
from vaecf.bench import speed as bench
from vaecf.models import fused, softmax_kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch-size", type=int, action="append")
    ap.add_argument("--precision", action="append")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    bench.add_shape_arguments(ap)
    a = ap.parse_args()
    dev = torch.device(a.device)
    data = bench.synthetic_csr(a.users, a.items, a.nnz)
    print(f"{hardware.device_name(dev)}, torch {torch.__version__}; kernels run here: "
          f"{softmax_kernels.available(dev)}")  # fmt: skip
    print("| batch | precision | PyTorch's softmax users/s (ms) | Triton kernels users/s (ms) "
          "| ratio |")  # fmt: skip
    print("|---:|---|---:|---:|---:|")
    for b in a.batch_size or [500, 24576]:
        for p in a.precision or ["bf16"]:
            ms = {False: [], True: []}
            for _ in range(a.rounds):
                for use in (False, True):
                    fused.USE_KERNELS = use
                    r = bench.bench_train(p, b, steps=a.steps, device=a.device, data=data,
                                          progress=False)  # fmt: skip
                    ms[use].append(r.step_ms)
            off, on = statistics.median(ms[False]), statistics.median(ms[True])
            print(f"| {b:,} | {p} | {1e3 * b / off:,.0f} ({off:.2f}) | {1e3 * b / on:,.0f} "
                  f"({on:.2f}) | {off / on:.2f}x |", flush=True)  # fmt: skip
    fused.USE_KERNELS = True
    print("shapes the autotuner kept:", softmax_kernels.chosen())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
