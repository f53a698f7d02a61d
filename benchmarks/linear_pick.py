"""Two ways of having both EDLAE and DLAE, replayed on runs `accuracy_compare.py` fitted:
picking one per split by validation NDCG@100, and averaging their B. Test NDCG@100 per seed.

    python benchmarks/linear_pick.py --out DIR --dataset ml-latest-small \
        [--runs edlae,dlae] [--seeds 98765,1,2,3,4]

DIR/DATASET/runs/NAME/seed-S are the compare runs (edlae, and dlae = `[model] name = "edlae"`,
`emphasis = "none"`), DIR/DATASET/data/seed-S their prepared splits.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from vaecf import rundir
from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.models.ease import _metrics_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--runs", default="edlae,dlae")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    a = ap.parse_args()
    first, second = a.runs.split(",")
    rows = {"pick by validation": [], "average of B": []}
    for seed in a.seeds.split(","):
        ds = PreparedDataset(a.out / a.dataset / "data" / f"seed-{seed}")
        test = [CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te")]
        runs = [a.out / a.dataset / "runs" / name / f"seed-{seed}" for name in (first, second)]
        res = [json.loads((r / "results.json").read_text()) for r in runs]
        best = max(res, key=lambda r: r["validation"]["ndcg@100"])
        rows["pick by validation"].append(best["test"]["ndcg@100"])
        w = [rundir.load_model(r)[0].weight for r in runs]
        rows["average of B"].append(_metrics_of((w[0] + w[1]) / 2, *test)["ndcg@100"])
    for name, values in rows.items():
        per_seed = " ".join(f"{v:.4f}" for v in values)
        print(f"{name:<20s} {statistics.mean(values):.4f}   {per_seed}")


if __name__ == "__main__":
    main()
