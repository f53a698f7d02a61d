"""The sparse first layer's kernels side by side: forward + backward, per batch and precision.

On a batch of a synthetic ML-20M-shaped matrix (models/first_layer.py).

    python benchmarks/first_layer.py [--device cuda] [--batch-size 500 --batch-size 24576]
                                     [--precision fp32 --precision bf16] [--hidden 600]

Each cell is the median of 5 timed calls after 2 warm-ups, synchronised; "chosen" is what
`vaecf train --first-layer auto` would keep (the fastest whose output agrees with
embedding_bag's). On a CPU every kernel is timed here, though training keeps embedding_bag.
"""

from __future__ import annotations

import argparse

import torch

from vaecf import precision as prec
from vaecf.bench import hardware
from vaecf.bench import speed as bench
from vaecf.data.matrix import CSR
from vaecf.models import first_layer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-size", type=int, action="append")
    ap.add_argument("--precision", action="append")
    ap.add_argument("--hidden", type=int, default=600)
    bench.add_shape_arguments(ap)
    a = ap.parse_args()
    dev = prec.resolve_device(a.device)
    csr = CSR.from_scipy(bench.synthetic_csr(a.users, a.items, a.nnz), dev)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    weight = torch.nn.init.xavier_uniform_(torch.empty(a.items, a.hidden, device=dev))
    print(
        f"first layer {a.items} x {a.hidden}, {hardware.device_name(dev)}, "
        f"torch {torch.__version__}"
    )
    print(
        f"{'batch':>6s} {'precision':>9s} "
        + "".join(f"{k:>10s}" for k in first_layer.KERNELS)
        + "  chosen   (ms, forward + backward)"
    )
    for b in a.batch_size or [500, 24576]:
        rows = torch.randint(0, csr.n_rows, (b,), generator=gen).to(dev)
        batch = csr.batch(rows)
        v = batch.values * torch.rsqrt(batch.row_sums(batch.values**2))[batch.row_ids]
        for p in a.precision or bench.default_precisions(a.device):
            kernels = [k for k in first_layer.KERNELS if k != "dense" or b * a.items * 4 <= 8 << 30]
            with prec.matmul_scope(dev, p), prec.autocast(dev, p):
                chosen, times = first_layer.choose(batch, weight, v, kernels)
            cells = "".join(
                f"{t:10.2f}" if isinstance(t, float) else f"{'fail':>10s}"
                for t in (times.get(k, "-") for k in first_layer.KERNELS)
            )
            print(f"{b:6d} {p:>9s} {cells}  {chosen}", flush=True)
            for k, t in times.items():
                if isinstance(t, str):
                    print(f"    {k}: {t}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
