"""Where the FLOPs go: this machine's matmul speed for the products Mult-VAE spends its time in.

Prints GFLOP/s of a square product (the machine's ceiling) and of the output layer's three
products at batch 500 (forward, input gradient, weight gradient), in each weight layout, for
fp32 and bf16; then the batch-1 and batch-1,024 scoring product in both layouts, which is what
`vaecf.models.multvae.Scorer` chooses between, and the serving copies' output layer (fp32,
bf16, and the int8 one of `--precision int8`) at batch 1 to 1,024. The element-wise softmax
sweep of a training step is timed as vaecf does it (one exp per logit) and as a logsumexp in
forward plus an exp in backward would (two), to show what that pass costs.

    python benchmarks/matmul.py [--items 20108] [--reps 5] [--bf16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vaecf.models.serving import INT8_KERNEL_ROWS, Int8Linear
from vaecf.precision import native_bf16
from vaecf.runtime import tune_cpu_allocator


def seconds(fn, reps: int, *args) -> float:
    """Median seconds of fn(*args) over `reps` calls, after one untimed call."""
    fn(*args)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=20_108)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="time bf16 too where it is emulated (minutes; always timed where native)",
    )
    a = ap.parse_args()
    tune_cpu_allocator()
    torch.manual_seed(0)
    n, b, d = a.items, a.batch, 600
    print(f"{torch.get_num_threads()} threads; output layer {b} x {d} x {n}")
    w = torch.randn(n, d)  # nn.Linear layout (n_items, d)
    _layouts(w, b, a.reps, a.bf16 or native_bf16(torch.device("cpu")))
    _scoring(w, a.reps)
    _serving_layer(n, d, a.reps)
    _softmax_sweep(b, n, a.reps)
    return 0


def _layouts(w: torch.Tensor, b: int, reps: int, bf16: bool) -> None:
    """The output layer's three products in each weight layout, and the square ceiling."""
    n, d = w.shape
    print(f"{'product':44s} {'fp32 GFLOP/s':>13s} {'bf16 GFLOP/s':>13s}")
    sq, flop = 1024, 2 * b * d * n
    g, h = torch.randn(b, n), torch.randn(b, d)
    results: dict[str, dict[str, float]] = {}

    def record(name: str, dtype_name: str, fl: float, x, y, reps: int = reps) -> None:
        results.setdefault(name, {})[dtype_name] = fl / seconds(torch.mm, reps, x, y) / 1e9

    for dtn, dt in [("fp32", torch.float32)] + ([("bf16", torch.bfloat16)] if bf16 else []):
        x, y = torch.randn(sq, sq, dtype=dt), torch.randn(sq, sq, dtype=dt)
        # once only: an emulated bf16 product of this size takes seconds
        record(f"square {sq}^3 (the ceiling)", dtn, 2 * sq**3, x, y, reps=1)
        wd, wt, gd, hd = w.to(dt), w.t().contiguous().to(dt), g.to(dt), h.to(dt)
        record("forward h @ W.T, W (n_items, d)", dtn, flop, hd, wd.t())
        record("forward h @ Wt, Wt (d, n_items)", dtn, flop, hd, wt)
        record("input grad g @ W", dtn, flop, gd, wd)
        record("weight grad g.T @ h -> (n_items, d)", dtn, flop, gd.t(), hd)
        record("weight grad h.T @ g -> (d, n_items)", dtn, flop, hd.t(), gd)
    for name, r in results.items():
        print(f"{name:44s} {r['fp32']:13.1f} {r.get('bf16', float('nan')):13.1f}")


def _scoring(w: torch.Tensor, reps: int) -> None:
    print("\nscoring product, fp32, ms (W (n_items, d) as nn.Linear vs Wt (d, n_items))")
    n, d = w.shape
    bias, wt = torch.randn(n), w.t().contiguous()
    for bs in (1, 1024):
        x = torch.randn(bs, d)
        lin = seconds(torch.nn.functional.linear, reps * 4, x, w, bias) * 1e3
        tr = seconds(torch.addmm, reps * 4, bias, x, wt) * 1e3
        print(f"batch {bs:5d}: nn.Linear layout {lin:8.2f}   transposed {tr:8.2f}")


def _serving_layer(n: int, d: int, reps: int) -> None:
    print("\nserving output layer, ms (vaecf.models.serving.Int8Linear against fp32 and bf16)")
    lin32 = torch.nn.Linear(d, n)
    lin16 = torch.nn.Linear(d, n).to(torch.bfloat16)
    q8 = Int8Linear(lin32, torch.float32)
    lin32.weight.data = lin32.weight.data.t().contiguous().t()  # the fp32 serving copy's layout
    names = {"int8": "int8 x int8", "kernel": "weight-only kernel", "fbgemm": "fbgemm"}
    with torch.no_grad():
        for bs in (1, 8, 16, 64, 1024):
            x = torch.randn(bs, d)
            t32 = seconds(lin32, reps * 4, x) * 1e3
            t16 = seconds(lin16, reps * 4, x.bfloat16()) * 1e3
            t8 = seconds(q8, reps * 4, x) * 1e3
            how = names.get(q8.small if bs <= INT8_KERNEL_ROWS else q8.large, "dequantized blocks")
            print(f"batch {bs:5d}: fp32 {t32:8.2f}   bf16 {t16:8.2f}   int8 {t8:8.2f} ({how})")


def _softmax_sweep(b: int, n: int, reps: int) -> None:
    """A logsumexp in forward and an exp in backward, against vaecf's one exp."""
    logits = torch.randn(b, n) * 3
    coef = torch.rand(b, 1)
    chunk = max(1, (1 << 20) // (4 * n))

    def two_exps():
        t = logits.clone()
        lse = torch.cat([torch.logsumexp(t[i : i + chunk], 1) for i in range(0, b, chunk)])
        for i in range(0, b, chunk):
            t[i : i + chunk].sub_(lse[i : i + chunk, None]).exp_().mul_(coef[i : i + chunk])

    def one_exp():
        t = logits.clone()
        for i in range(0, b, chunk):
            r = t[i : i + chunk]
            top = r.amax(1, keepdim=True)
            r.sub_(top).exp_()
            r.div_(r.sum(1, keepdim=True))
        t.mul_(coef)

    copy = seconds(logits.clone, reps * 2)
    print(
        f"\nsoftmax sweep over ({b}, {n}) fp32 logits, ms: "
        f"two exps {1e3 * (seconds(two_exps, reps * 2) - copy):.1f}, "
        f"one exp (vaecf) {1e3 * (seconds(one_exp, reps * 2) - copy):.1f}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
