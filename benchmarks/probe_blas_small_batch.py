"""Probe: the fp32 output layer's product at small batches, PyTorch's BLAS against numpy's.

    python benchmarks/probe_blas_small_batch.py mkl_t|mkl_linear|ob1|ob2   # one per process

(B x 600) times the ML-20M output layer (600 x 20,108), B = 1 to 256, median ms of 50 calls:
PyTorch's addmm on the transposed weight (the fp32 Scorer's layout, `mkl_t`) or F.linear on the
nn.Linear layout (`mkl_linear`), numpy's matmul on one BLAS thread (`ob1`, threadpoolctl) or
on its pool (`ob2`). One variant per process: two thread pools in one process disturb each other.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from vaecf import hardware


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["mkl_t", "mkl_linear", "ob1", "ob2"])
    a = ap.parse_args()
    blas = ThreadpoolController().select(user_api="blas")
    w = torch.randn(20108, 600)
    wt, b = w.t().contiguous(), torch.randn(20108)
    wn = wt.numpy()
    out = {}
    for m in (1, 2, 4, 8, 16, 64, 256):
        h = torch.randn(m, 600)
        hn = h.numpy()

        def call(h=h, hn=hn) -> None:
            if a.which == "mkl_t":
                torch.addmm(b, h, wt)
            elif a.which == "mkl_linear":
                torch.nn.functional.linear(h, w, b)
            elif a.which == "ob1":
                with blas.limit(limits=1):
                    hn @ wn  # noqa: B018
            else:
                hn @ wn  # noqa: B018

        ts = []
        for _ in range(60):
            t0 = time.perf_counter()
            call()
            ts.append(time.perf_counter() - t0)
        out[m] = round(float(np.median(ts[10:])) * 1e3, 2)
    print(a.which, out, hardware.machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
