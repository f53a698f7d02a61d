"""Probe: would the output layer's weight stored transposed, (d, n_items) contiguous, speed up
the CPU's bf16 training step? Times its three bf16 products in either layout, and fused Adam on
a (n_items, d) parameter stored either way (a column-major Parameter is what nn.Linear would
hold).

    python benchmarks/probe_output_layout.py [--rounds 12]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vaecf.hardware import cpu_name
from vaecf.runtime import tune_cpu_allocator


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    tune_cpu_allocator()
    torch.manual_seed(0)
    b, n, d = 500, 20108, 600
    bf = torch.bfloat16
    g, h = torch.randn(b, n).to(bf), torch.randn(b, d).to(bf)
    w_row = torch.randn(n, d).to(bf)
    w_col = w_row.t().contiguous().t()  # the same (n, d) values, stored (d, n)
    params = {}
    for name, layout in (("row", lambda t: t), ("col", lambda t: t.t().contiguous().t())):
        p = torch.nn.Parameter(layout(torch.randn(n, d)))
        p.grad = layout(torch.randn(n, d))
        params[name] = (p, torch.optim.Adam([p], lr=1e-3, fused=True))
    cases = {
        "forward h @ W^T, W (n, d) row-major": lambda: h @ w_row.t(),
        "forward, W stored (d, n)": lambda: h @ w_col.t(),
        "input grad g @ W, row-major": lambda: g @ w_row,
        "input grad, W stored (d, n)": lambda: g @ w_col,
        "weight grad g^T @ h -> (n, d)": lambda: g.t() @ h,
        "weight grad (h^T @ g)^T -> stored (d, n)": lambda: (h.t() @ g).t(),
        "fused Adam, row-major parameter": params["row"][1].step,
        "fused Adam, column-major parameter": params["col"][1].step,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for f in cases.values():
        f()
    for _ in range(a.rounds):  # alternating: every case sees the same minutes of the machine
        for k, f in cases.items():
            t0 = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t0) * 1e3)
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for k, v in times.items():
        print(f"  {k:45s} {statistics.median(v):8.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
