"""Autoencoder training at large catalogues: users/s and peak GPU memory per item count.

`vaecf bench train`'s step (batch 500) at several item counts, each model and precision.

    python benchmarks/train_items.py --device cuda [--items 100000,500000] [--users 300000]
        [--nnz 9000000] [--models multvae,recvae] [--precisions fp32,bf16] [--steps N]

Peak memory is `torch.cuda.max_memory_allocated` on a GPU; on a CPU time the CLI under
/usr/bin/time instead (benchmarks/README.md, "Autoencoders at 100,000 and 500,000 items").
RecVAE times 10 steps (each holds 4 updates), Mult-VAE 20, unless `--steps` says otherwise.
"""

from __future__ import annotations

import argparse

import torch

from vaecf.bench import hardware
from vaecf.bench import speed as bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--items", default="100000,500000")
    ap.add_argument("--users", type=int, default=300_000)
    ap.add_argument("--nnz", type=int, default=9_000_000)
    ap.add_argument("--models", default="multvae,recvae")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, help="timed steps (default: RecVAE 10, Mult-VAE 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    a = ap.parse_args()
    gpu = torch.device(a.device).type == "cuda"
    print(f"{hardware.device_name(a.device)}; {a.users:,} users, {a.nnz:,} interactions, batch 500")
    for items in (int(v) for v in a.items.split(",")):
        data = bench.synthetic_csr(a.users, items, a.nnz)
        for model in a.models.split(","):
            for p in a.precisions.split(","):
                if gpu:
                    torch.cuda.reset_peak_memory_stats()
                r = bench.bench_train(
                    p, 500, steps=a.steps or (10 if model == "recvae" else 20), warmup=a.warmup,
                    device=a.device, model=model, progress=False, data=data,
                )  # fmt: skip
                peak = f"peak {torch.cuda.max_memory_allocated() / 2**30:6.2f} GiB" if gpu else ""
                print(
                    f"{items:>7d} {model:8s} {p:5s} {r.users_per_s:9.0f} users/s "
                    f"{r.step_ms:7.1f} ms {peak}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
