"""Probe: other versions of fused.py beside the package's, training steps in turn.

    python benchmarks/probe_softmax_cpu.py --variant head=OLD/fused.py --variant b=B.py
                                           [--precision bf16] [--rounds 8]

Loads each variant's fused.py and swaps `LinearMultinomialNLL` between rounds of `bench_train`
(ML-20M shape, batch 500, 10 steps after 3 warm-ups), the order reversed every other round, and
prints the medians of the step, its forward and its backward for each, "current" included.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics

from vaecf import bench, hardware
from vaecf.models import fused


def load(label: str, path: str):
    spec = importlib.util.spec_from_file_location(f"fused_{label}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LinearMultinomialNLL


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=[], help="LABEL=PATH of a fused.py")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    variants = {k: load(k, p) for k, p in (v.split("=", 1) for v in a.variant)}
    variants["current"] = fused.LinearMultinomialNLL
    data = bench.synthetic_csr(bench.ML20M["users"], bench.ML20M["items"], bench.ML20M["nnz"])
    res = {k: [] for k in variants}
    for r in range(a.rounds):
        for k in list(variants) if r % 2 == 0 else list(reversed(variants)):
            fused.LinearMultinomialNLL = variants[k]
            t = bench.bench_train(a.precision, 500, steps=10, warmup=3, progress=False, data=data)
            res[k].append((t.step_ms, t.breakdown_ms["forward"], t.breakdown_ms["backward"]))
    print(f"| {a.precision} | step ms | forward | backward |\n|---|---:|---:|---:|")
    for k, v in res.items():
        med = [statistics.median(x[i] for x in v) for i in range(3)]
        print(f"| {k} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} |")
    print(f"medians of {a.rounds} rounds; {hardware.machine()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
