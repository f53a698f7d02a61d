"""Probe: which thread pools a one-row fp32 answer should use, numpy's BLAS beside PyTorch's.

    python benchmarks/probe_one_row_threads.py blas1|blas2|blas2+omp1|blas1+omp1

`Recommender.recommend` of an ML-20M-sized Mult-VAE (random weights), fp32, 1,500 histories of
10 items, k = 10, p50 and p99 ms. blas1: numpy's BLAS held to one thread for the output layer
(as shipped on AMD CPUs); blas2: on its pool of two; +omp1: PyTorch's OpenMP held to one thread
for the whole answer (threadpoolctl).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController

from vaecf import hardware, runtime
from vaecf.recommender import Recommender
from vaecf.serve.fixtures import fresh_run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["blas1", "blas2", "blas2+omp1", "blas1+omp1"])
    a = ap.parse_args()
    if a.mode.startswith("blas2"):
        runtime.one_blas_thread = contextlib.nullcontext
    omp = ThreadpoolController().select(user_api="openmp")
    run = fresh_run(Path(tempfile.mkdtemp()) / "run", 20108, "multvae")
    rec = Recommender.load(run, precision="fp32")
    rng = random.Random(0)
    histories = [rng.sample(range(20108), 10) for _ in range(1000)]

    def call(h):
        if a.mode.endswith("omp1"):
            with omp.limit(limits=1):
                return rec.recommend(h, k=10)
        return rec.recommend(h, k=10)

    for i in range(200):
        call(histories[i % 1000])
    ts = []
    for i in range(1500):
        t0 = time.perf_counter()
        call(histories[i % 1000])
        ts.append(time.perf_counter() - t0)
    p50, p99 = np.percentile(ts, 50) * 1e3, np.percentile(ts, 99) * 1e3
    print(f"{a.mode}: p50 {p50:.3f} p99 {p99:.3f} ms; {hardware.machine()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
