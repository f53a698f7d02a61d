"""Probe: the fused output layer before and after a change, training steps in turn.

    python benchmarks/probe_fused_cpu.py --before OLD/fused.py [--precision bf16] [--rounds 6]

Loads the older fused.py beside the package's, swaps `LinearMultinomialNLL` between rounds of
`bench_train` (ML-20M shape, batch 500, 10 steps after 3 warm-ups) and prints each round's step
and its parts, then the medians. Same process, same data, alternating order each round.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics

from vaecf import bench
from vaecf.models import fused


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("fused_before", a.before)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    variants = {"before": old.LinearMultinomialNLL, "after": fused.LinearMultinomialNLL}
    data = bench.synthetic_csr(bench.ML20M["users"], bench.ML20M["items"], bench.ML20M["nnz"])
    steps = {k: [] for k in variants}
    for r in range(a.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for k in order:
            fused.LinearMultinomialNLL = variants[k]
            t = bench.bench_train(a.precision, 500, steps=10, warmup=3, progress=False, data=data)
            steps[k].append(t.step_ms)
            parts = " / ".join(f"{v:.1f}" for v in t.breakdown_ms.values())
            print(f"round {r} {k:6s} step {t.step_ms:6.1f} ms  ({parts})", flush=True)
    for k, v in steps.items():
        print(f"{k}: median step {statistics.median(v):.1f} ms over {len(v)} rounds")
    print(bench.machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
