"""A lead, not in the package: what RecVAE+EDLAE would score if its untrained start (a zero
decoder, alpha x B: exactly EDLAE's ranking) were validated as an "epoch 0" and kept when no
trained epoch beats it on validation. Replayed from finished runs of `accuracy_compare.py`: the
hybrid's best epoch (label HYB) against `--model edlae` (whose fit its start equals when both
use the same rows and penalty: `fold_in_rows = true`, `linear_popularity_exponent = 0.1`).

    python benchmarks/hybrid_start.py --out DIR [--hybrid rve-fi-pen]
        [--datasets ml-latest-small,filmtrust]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from vaecf.rundir import load_results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--hybrid", default="rve-fi-pen")
    ap.add_argument("--datasets", default="ml-latest-small,filmtrust")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    a = ap.parse_args()
    for d in a.datasets.split(","):
        got, ease = [], []
        for s in a.seeds.split(","):
            run = {
                m: load_results(a.out / d / "runs" / m / f"seed-{s}")
                for m in (a.hybrid, "edlae", "ease")
            }
            hv, ev = (run[m]["validation"]["ndcg@100"] for m in (a.hybrid, "edlae"))
            kept = "edlae" if ev >= hv else a.hybrid
            got.append(run[kept]["test"]["ndcg@100"])
            ease.append(run["ease"]["test"]["ndcg@100"])
            print(
                f"{d} seed {s}: validation {hv:.4f} trained, {ev:.4f} start -> {kept} {got[-1]:.4f}"
            )
        diff = statistics.mean(got) - statistics.mean(ease)
        print(f"{d}: {statistics.mean(got):.4f}, EASE {diff:+.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
