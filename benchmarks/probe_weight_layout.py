"""Probe: with today's pieced weight gradient, would the output layer's weight stored (d, n_items)
pay on the CPU's bf16 step (probe_output_layout, 2026-11-27, said -3.9 ms over the products)?

    python benchmarks/probe_weight_layout.py

ML-20M's output layer at batch 500 (500 x 600 hidden, 20,108 items), bf16 operands, alternating
rounds, median ms of each, the allocator tuned as training tunes it:
- the weight gradient as `fused.weight_grad` takes it: pieces of 4,096 item rows, each product
  widened into a float32 (n_items, d) array; the same pieces landing in a (d, n_items) array;
  and (n_items, d) pieces computed as h^T g then transposed;
- the weight's cast to bf16: from (n_items, d) as it is, and transposed into (d, n_items);
- the forward and input-gradient products with the bf16 weight in either layout.
"""

from __future__ import annotations

import statistics
import time

import torch

from vaecf.hardware import cpu_name
from vaecf.runtime import tune_cpu_allocator

B, N, D, ROWS = 500, 20_108, 600, 4096


def main() -> int:
    tune_cpu_allocator()
    torch.manual_seed(0)
    g = torch.randn(B, N).bfloat16()
    h = torch.randn(B, D).bfloat16()
    w = torch.randn(N, D)
    wc, wct = w.bfloat16(), w.t().contiguous().bfloat16()

    def grad_rows() -> torch.Tensor:  # fused.weight_grad today
        out = torch.empty(N, D)
        for lo in range(0, N, ROWS):
            out[lo : lo + ROWS] = g[:, lo : lo + ROWS].t() @ h
        return out

    def grad_cols() -> torch.Tensor:  # the same pieces into (d, n_items)
        out = torch.empty(D, N)
        for lo in range(0, N, ROWS):
            out[:, lo : lo + ROWS] = h.t() @ g[:, lo : lo + ROWS]
        return out

    def grad_rows_transposed() -> torch.Tensor:  # (n_items, d) pieces from h^T g
        out = torch.empty(N, D)
        for lo in range(0, N, ROWS):
            out[lo : lo + ROWS] = (h.t() @ g[:, lo : lo + ROWS]).t()
        return out

    runs = {
        "weight grad, pieces into (n_items, d) [today]": grad_rows,
        "weight grad, pieces into (d, n_items)": grad_cols,
        "weight grad, (h^T g)^T pieces into (n_items, d)": grad_rows_transposed,
        "cast to bf16, (n_items, d) [today]": lambda: w.to(torch.bfloat16),
        "cast to bf16, transposed into (d, n_items)": lambda: w.t().contiguous().bfloat16(),
        "forward h @ W^T, W (n_items, d) [today]": lambda: h @ wc.t(),
        "forward h @ W^T, W stored (d, n_items)": lambda: h @ wct,
        "input grad g @ W, W (n_items, d) [today]": lambda: g @ wc,
        "input grad g @ W, W stored (d, n_items)": lambda: g @ wct.t(),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for f in runs.values():
        f()
    for _ in range(10):
        for name, f in runs.items():
            t0 = time.perf_counter()
            f()
            times[name].append((time.perf_counter() - t0) * 1e3)
    torch.testing.assert_close(grad_rows(), grad_cols().t())
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for name, ts in times.items():
        print(f"{name:50s} {statistics.median(ts):8.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
