"""The sparse solver against the dense one, measured on many more users than a test split
holds. Two runs of `vaecf compare` on the same splits, EDLAE with `--selection cv` and the
second with `--solver sparse`, score every full-catalogue point they try on the validation
users and on 5 folds of the training users (each fold's B solved without its users' targets).
Their fast searches run the same dense coarse stage, so they try the same full-catalogue
points, and each point's fold figure is a paired comparison of the two solvers on every
training user with 5 or more items (ml-latest-small: ~500 per split; FilmTrust: ~800),
against 50 or 150 test users. Prints, per split, each common point's cv NDCG@100 (dense,
sparse, difference), the point each run chose and its test NDCG@100, then the means.

    python benchmarks/sparse_cv_gap.py --runs DIR/ml-latest-small/runs --dense cvb \
        --sparse cvb-sp

DIR: the `vaecf compare --out DIR` directory; `cvb`/`cvb-sp` the runs' labels.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from vaecf import rundir


def fit_record(run: Path) -> dict:
    """The fit's record (the metrics.jsonl row with the search's grid)."""
    return next(r for r in rundir.read_metrics(run) if "grid" in r)


def key(row: dict) -> tuple[float, float, float]:
    return (round(row["l2"], 6), row.get("dropout", 0.0), row["popularity_exponent"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="a compare run's runs/ directory")
    ap.add_argument("--dense", required=True, help="label of the dense solver's runs")
    ap.add_argument("--sparse", required=True, help="label of the sparse solver's runs")
    a = ap.parse_args()
    root = Path(a.runs)
    gaps, chosen_gaps, tests = [], [], []
    for split in sorted(p.name for p in (root / a.sparse).glob("seed-*")):
        runs = {s: root / label / split for s, label in (("dense", a.dense), ("sparse", a.sparse))}
        if not all((r / "results.json").exists() for r in runs.values()):
            continue
        recs = {s: fit_record(r) for s, r in runs.items()}
        grids = {
            s: {key(g): g for g in rec["grid"] if g["stage"] == "full" and "cv" in g}
            for s, rec in recs.items()
        }
        common = sorted(set(grids["dense"]) & set(grids["sparse"]))
        test = {s: rundir.load_results(r)["test"]["ndcg@100"] for s, r in runs.items()}
        print(f"{split}: {recs['sparse']['grid'][-1]['cv']['n_users']} fold users")
        for pt in common:
            d, s = (grids[x][pt]["cv"]["ndcg@100"] for x in ("dense", "sparse"))
            gaps.append(s - d)
            print(
                f"  lambda {pt[0]:8.2f} p {pt[1]:4g} beta {pt[2]:4g}: cv dense {d:.4f} "
                f"sparse {s:.4f} ({s - d:+.4f})"
            )
        picks = {s: key(rec) for s, rec in recs.items()}
        if picks["dense"] in common:
            g = grids["sparse"][picks["dense"]]["cv"]["ndcg@100"]
            chosen_gaps.append(g - grids["dense"][picks["dense"]]["cv"]["ndcg@100"])
        tests.append(test["sparse"] - test["dense"])
        for s in ("dense", "sparse"):
            pt = picks[s]
            print(
                f"  {s:6s} chose lambda {pt[0]:.2f} p {pt[1]:g} beta {pt[2]:g}: test {test[s]:.4f}"
            )
    print(
        f"mean sparse - dense: cv {np.mean(gaps):+.4f} over {len(gaps)} points "
        f"(at the dense run's choice {np.mean(chosen_gaps):+.4f}, {len(chosen_gaps)} splits); "
        f"test {np.mean(tests):+.4f} over {len(tests)} splits"
    )


if __name__ == "__main__":
    main()
