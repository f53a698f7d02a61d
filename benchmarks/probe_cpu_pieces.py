"""Probe: CPU timings behind three figures of 2026-11-28 in benchmarks/README.md.

    python benchmarks/probe_cpu_pieces.py [--rounds 40]

1. RecVAE's sample and KL against its composite prior, forward and backward, as plain autograd
   of the formulas (the code before models/latent.CompositePriorSampleKL) and as that function,
   at 500 x 200, fp32 and bf16, in alternating rounds.
2. The first layer's kernels (models/first_layer.py) alone, forward and backward to the weight,
   bf16 autocast, ML-20M shape, batch 500, in turn (each evicts the others from cache).
3. The first layer's backward inside a whole bf16 Mult-VAE step, by autograd hooks: from the
   gradient reaching the first layer's output to the weight's gradient being accumulated.

The allocator is tuned first, as training and `vaecf bench` tune it (vaecf.runtime: freed
blocks stay in the heap, so a fresh 48 MB gradient takes no page faults).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

import vaecf.models.first_layer as first_layer
from vaecf import bench, models
from vaecf.data.matrix import CSR
from vaecf.gradient import make_optimizer
from vaecf.hardware import machine
from vaecf.models.latent import composite_sample_kl
from vaecf.runtime import tune_cpu_allocator

LOG_W = torch.log(torch.tensor([0.15, 0.75, 0.10]))


def log_normal(z, mu, logvar):
    return -0.5 * (logvar + math.log(2 * math.pi) + (z - mu) ** 2 * torch.exp(-logvar))


def autograd_kl(mu, lv, pm, plv, w):
    z = mu + torch.randn_like(mu) * torch.exp(0.5 * lv)
    zf, m, lf = z.float(), mu.float(), lv.float()
    zero = torch.zeros(())
    parts = torch.stack(
        [log_normal(zf, zero, zero), log_normal(zf, pm.float(), plv.float()),
         log_normal(zf, zero, zero + 10.0)], -1,
    ) + LOG_W  # fmt: skip
    kl = (log_normal(zf, m, lf) - torch.logsumexp(parts, -1)).sum(1)
    return z, kl.sum(), (w * kl).sum()


def function_kl(mu, lv, pm, plv, w):
    z, kl, term = composite_sample_kl(mu, lv, pm, plv, LOG_W, 10.0, w, True)
    return z.to(mu.dtype), kl, term


def latent(rounds: int) -> None:
    for dt in (torch.float32, torch.bfloat16):
        mu = torch.randn(500, 200).to(dt).requires_grad_()
        lv = (torch.randn(500, 200) - 1).to(dt).requires_grad_()
        pm, plv, v = (torch.randn(500, 200).to(dt) for _ in range(3))
        w = torch.rand(500)
        res = {"autograd": [], "function": []}
        for i in range(rounds + 5):
            for name, f in (("autograd", autograd_kl), ("function", function_kl)):
                t0 = time.perf_counter()
                z, kl, term = f(mu, lv, pm, plv, w)
                t1 = time.perf_counter()
                torch.autograd.grad((z * v).sum() + term, [mu, lv])
                if i >= 5:
                    res[name].append((t1 - t0, time.perf_counter() - t1))
        for name, r in res.items():
            fwd = statistics.median(a for a, _ in r) * 1e3
            bwd = statistics.median(b for _, b in r) * 1e3
            what = f"RecVAE latent {str(dt)[6:]:8s} {name:8s}"
            print(f"  {what} forward {fwd:6.2f} ms  backward {bwd:6.2f} ms")


def kernels(csr: CSR, rounds: int) -> None:
    w = torch.nn.Parameter(torch.randn(csr.shape[1], 600) * 0.01)
    g = torch.randn(500, 600)
    res = {k: [] for k in first_layer.KERNELS}
    for i in range(rounds // 4 + 2):
        b = csr.batch(torch.randperm(csr.n_rows)[:500])
        for k in res:
            w.grad = None
            t0 = time.perf_counter()
            with torch.autocast("cpu", torch.bfloat16):
                out = first_layer.product(b, w, b.values, k)
            t1 = time.perf_counter()
            out.backward(g.to(out.dtype))
            if i >= 2:
                res[k].append((t1 - t0, time.perf_counter() - t1))
    for k, r in res.items():
        fwd = statistics.median(a for a, _ in r) * 1e3
        bwd = statistics.median(b for _, b in r) * 1e3
        print(f"  first layer alone {k:6s} forward {fwd:6.2f} ms  backward {bwd:6.2f} ms")


def in_step(csr: CSR, rounds: int) -> None:
    net = models.build("multvae", csr.shape[1]).train()
    opt = make_optimizer(net, 1e-3, torch.device("cpu"))
    marks = {}
    net.in_weight.register_post_accumulate_grad_hook(
        lambda p: marks.__setitem__("w", time.perf_counter())
    )
    product = first_layer.product

    def hooked(*a, **k):
        out = product(*a, **k)
        if out.requires_grad:
            out.register_hook(lambda grad: marks.__setitem__("h", time.perf_counter()))
        return out

    first_layer.product = hooked
    res = []
    for i in range(rounds // 2 + 4):
        b = csr.batch(torch.randint(0, csr.n_rows, (500,)))
        t0 = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16):
            loss, _ = net.loss(b, 0.2, 500)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 4:
            res.append((time.perf_counter() - t0, marks["w"] - marks["h"]))
    first_layer.product = product
    step = statistics.median(a for a, _ in res) * 1e3
    fl = statistics.median(b for _, b in res) * 1e3
    print(f"  bf16 Mult-VAE step {step:6.2f} ms, of which the first layer's backward {fl:5.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--users", type=int, default=136_677)
    ap.add_argument("--items", type=int, default=20_108)
    ap.add_argument("--nnz", type=int, default=10**7)
    a = ap.parse_args()
    tune_cpu_allocator()
    print(machine())
    latent(a.rounds)
    csr = CSR.from_scipy(bench.synthetic_csr(a.users, a.items, a.nnz))
    kernels(csr, a.rounds)
    in_step(csr, a.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
