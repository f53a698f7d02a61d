"""Probe: the CPU backward's products and sums, whole or in pieces (models/fused.py's
`weight_grad` and `column_sums`, and the alternatives not kept).

    python benchmarks/probe_backward_pieces.py [--rounds 8]

Median ms over alternating rounds: the bias gradient's float32 column sums of a (500, 20,108)
bf16 gradient, whole and in row chunks; the weight gradient g^T h with its float32 copy, whole
and in item pieces, at several shapes and in fp32; the forward and the input gradient in pieces.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vaecf.hardware import machine
from vaecf.runtime import tune_cpu_allocator

BF = torch.bfloat16


def timed(cases: dict, rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in cases}
    for f in cases.values():
        f()
    for _ in range(rounds):
        for k, f in cases.items():
            t0 = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def column_sums(g: torch.Tensor, rows: int) -> torch.Tensor:
    out = torch.zeros(g.shape[1])
    for lo in range(0, g.shape[0], rows):
        out += g[lo : lo + rows].sum(0, dtype=torch.float32)
    return out


def weight_grad(g: torch.Tensor, h: torch.Tensor, rows: int) -> torch.Tensor:
    n = g.shape[1]
    out = torch.empty(n, h.shape[1])
    for lo in range(0, n, rows):
        out[lo : lo + rows] = g[:, lo : lo + rows].t() @ h
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    r = ap.parse_args().rounds
    tune_cpu_allocator()
    torch.manual_seed(0)
    print(machine())
    g = torch.randn(500, 20108).to(BF)
    cases = {"column sums, whole": lambda: g.sum(0, dtype=torch.float32)}
    cases.update(
        {f"column sums, {c} rows": lambda c=c: column_sums(g, c) for c in (13, 25, 50, 100, 250)}
    )
    for shape in ((500, 20108, 600), (100, 60000, 600), (500, 60000, 600), (2000, 20108, 600),
                  (500, 8000, 600), (500, 20108, 200)):  # fmt: skip
        b, n, d = shape
        gg, hh = torch.randn(b, n).to(BF), torch.randn(b, d).to(BF)
        pieces = (1024, 2048, 4096, 8192) if shape == (500, 20108, 600) else (4096,)
        cases[f"weight grad {shape}, whole"] = lambda gg=gg, hh=hh: (gg.t() @ hh).float()
        for c in pieces:
            cases[f"weight grad {shape}, {c} rows"] = lambda gg=gg, hh=hh, c=c: weight_grad(
                gg, hh, c
            )
    g32, h32 = torch.randn(500, 20108), torch.randn(500, 600)
    cases["weight grad fp32, whole"] = lambda: g32.t() @ h32
    cases["weight grad fp32, 4096 rows"] = lambda: weight_grad(g32, h32, 4096)
    h, w = torch.randn(500, 600).to(BF), torch.randn(20108, 600).to(BF)
    cases["forward, whole"] = lambda: h @ w.t()
    cases["forward, 100 batch rows"] = lambda: torch.cat(
        [h[i : i + 100] @ w.t() for i in range(0, 500, 100)]
    )
    cases["input grad, whole"] = lambda: (g @ w).float()
    cases["input grad, 4096 items a piece"] = lambda: sum(
        (g[:, i : i + 4096] @ w[i : i + 4096]).float() for i in range(0, 20108, 4096)
    )
    for k, ms in timed(cases, r).items():
        print(f"  {k:48s} {ms:8.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
