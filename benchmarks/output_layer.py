"""The fused output layer with its logits' rows padded to several multiples, side by side.

Mult-VAE's output layer (B x d) @ (d x n_items), the multinomial NLL and its backward
(models/fused.py) on a batch of a synthetic ML-20M-shaped matrix: for each batch, precision and
padding multiple, the whole layer forward + backward, and its three products alone at that
width (logits h W^T, input grad g W, weight grad g^T h).

    python benchmarks/output_layer.py [--device cuda] [--batch-size 500 --batch-size 24576]
                                      [--precision tf32 --precision bf16] [--multiple 1 ...]

Each cell is the median of 5 synchronised calls after 2 warm-ups, in ms. A GPU pads to
`fused.GPU_MULTIPLE`, a CPU to 1 (no padding).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vaecf import precision as prec
from vaecf.bench import hardware
from vaecf.bench import speed as bench
from vaecf.data.matrix import CSR
from vaecf.models import fused

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def timed(fn, dev: torch.device, reps: int = 5, warmup: int = 2) -> float:
    times = []
    for i in range(warmup + reps):
        prec.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        prec.synchronize(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def products(h, w, width: int, dtype: torch.dtype):
    """The layer's three products at `width` columns, in `dtype`."""
    hc, wc = h.detach().to(dtype), fused.padded(w.detach(), dtype, width)
    g = hc @ wc.t()
    return lambda: (hc @ wc.t(), g @ wc, g.t() @ hc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-size", type=int, action="append")
    ap.add_argument("--precision", action="append")
    ap.add_argument("--multiple", type=int, action="append", help="default 1, 8, 64")
    ap.add_argument("--hidden", type=int, default=600)
    bench.add_shape_arguments(ap)
    a = ap.parse_args()
    dev = prec.resolve_device(a.device)
    csr = CSR.from_scipy(bench.synthetic_csr(a.users, a.items, a.nnz), dev)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    w = torch.nn.init.xavier_uniform_(torch.empty(a.items, a.hidden, device=dev))
    w.requires_grad_()
    bias = torch.zeros(a.items, device=dev, requires_grad=True)
    print(
        f"output layer {a.hidden} -> {a.items}, {hardware.device_name(dev)}, "
        f"torch {torch.__version__}"
    )
    print(
        f"{'batch':>6s} {'precision':>9s} {'multiple':>8s} {'width':>6s} {'layer ms':>9s} "
        f"{'products ms':>11s}"
    )
    for b in a.batch_size or [500, 24576]:
        batch = csr.batch(torch.randint(0, csr.n_rows, (b,), generator=gen).to(dev))
        h = torch.randn(b, a.hidden, device=dev, requires_grad=True)
        for p in a.precision or bench.default_precisions(a.device):
            dtype = HALF.get(p, torch.float32)
            for multiple in a.multiple or [1, 8, 64]:
                width = fused.logits_width(a.items, dev, multiple)

                def layer(h=h, batch=batch, multiple=multiple):
                    loss = fused.linear_multinomial_nll(h, w, bias, batch, multiple=multiple)
                    torch.autograd.grad(loss, [h, w, bias])

                with prec.autocast(dev, p):  # tf32's matmul setting included
                    t_layer = timed(layer, dev)
                    t_products = timed(products(h, w, width, dtype), dev)
                print(
                    f"{b:6d} {p:>9s} {multiple:8d} {width:6d} {t_layer:9.2f} {t_products:11.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
