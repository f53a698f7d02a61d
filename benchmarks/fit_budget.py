"""vaecf.fit's time budget: wall time and test NDCG@100 of `vaecf.fit(df)`, and unbudgeted.

For each dataset and split seed, `vaecf.fit(ratings, test=0.2, split_seed=S)` with its default
budget (60 s up to 100,000 rows, plus 60 s a further million) and, with --reference, the same
fit with no budget and no early stopping (`budget=1e9, patience=0`: what `auto` did before the
budget was a promise). Prints each fit's wall seconds (preparation, training and loading), its
budget, the winner, what stopped, and the test NDCG@100, with how many points EDLAE's coarse
stage tried and each fitted candidate's own test NDCG@100 (auto scores its winner alone); the
reference's, and the difference.

    python benchmarks/fit_budget.py [--datasets filmtrust,ml-latest-small,ml-1m]
        [--seeds 98765,1,2,3,4] [--reference | --reference-only] [--out DIR]

The frames are what a user would pass: ml-latest-small's ratings.csv and ML-1M's ratings.dat
(every rating an interaction, as `vaecf.fit(df)` takes them), FilmTrust's raw ratings.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

import polars as pl

import vaecf
from vaecf import rundir
from vaecf.bench.hardware import machine
from vaecf.data import synthetic
from vaecf.data.matrix import CSR
from vaecf.data.prepared import PreparedDataset
from vaecf.evaluate import evaluate_model
from vaecf.fitting import default_budget

ROOT = Path(__file__).resolve().parents[1]
METRIC = "ndcg@100"


def frame(name: str, a) -> pl.DataFrame:
    if name == "ml-latest-small":
        return pl.read_csv(a.data_root / "ml-latest-small" / "ratings.csv")
    if name == "filmtrust":
        rows = (a.data_root / "filmtrust" / "ratings.txt").read_text().split("\n")
        cells = [r.split() for r in rows if r.strip()]
        return pl.DataFrame(
            {"user": [int(c[0]) for c in cells], "item": [int(c[1]) for c in cells]}
        )
    if name == "ml-1m":
        lines = a.ml1m.read_text().splitlines()
        cells = [ln.split("::") for ln in lines]
        return pl.DataFrame(
            {"user": [int(c[0]) for c in cells], "item": [int(c[1]) for c in cells]}
        )
    if name == "demo":
        return synthetic.generate(n_users=300, n_items=60, mean_items=8, seed=1)
    raise SystemExit(f"unknown dataset {name}")


def one(df: pl.DataFrame, seed: int, **kw) -> dict:
    t0 = time.perf_counter()
    rec = vaecf.fit(df, test=0.2, split_seed=seed, progress=False, **kw)
    wall = time.perf_counter() - t0
    res = rec.results
    stops = [
        c["model"] + ": " + c["stopped"] for c in res["auto"]["candidates"] if c.get("stopped")
    ]
    stops += [c["model"] + ": skipped" for c in res["auto"]["candidates"] if c.get("skipped")]
    return {
        "wall": wall,
        "winner": res["auto"]["winner"],
        "stopped": ", ".join(stops) or "-",
        "test": res["test"][METRIC],
        **candidates(Path(rec.source)),
    }


def candidates(run: Path) -> dict:
    """Each fitted candidate of the auto run `run` scored on the fit's test users (auto scores
    its winner alone), and how many (lambda, p) points EDLAE's coarse stage tried."""
    ds = PreparedDataset(run.parent / "data")  # the fit's working directory: data/ and run/
    fold_in, target = (CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te"))
    tests, coarse = {}, math.nan
    for cand in sorted((run / "candidates").iterdir()):
        if not (cand / rundir.RESULTS).is_file():
            continue
        model, _ = rundir.load_model(cand, "cpu")
        tests[cand.name] = evaluate_model(model, fold_in, target)[METRIC]
        fits = [r for r in rundir.read_metrics(cand) if r.get("grid")]
        if cand.name == "edlae" and fits:
            coarse = len(
                {(g["l2"], g["dropout"]) for g in fits[0]["grid"] if g["stage"] == "coarse"}
            )
    return {"candidates_test": tests, "edlae_coarse_points": coarse}


def alone(got: dict) -> str:
    return ", ".join(f"{n} {v:.4f}" for n, v in got["candidates_test"].items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="filmtrust,ml-latest-small,ml-1m")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    ap.add_argument("--reference", action="store_true", help="also fit with no budget")
    ap.add_argument(
        "--reference-only",
        action="store_true",
        help="fit only with no budget (its figures do not depend on the machine's load)",
    )
    ap.add_argument("--budget", type=float, help="instead of the default budget (a quick look)")
    ap.add_argument("--out", type=Path, help="keep each row here as JSON (default: not kept)")
    ap.add_argument("--data-root", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument(
        "--ml1m", type=Path, default=Path.home() / ".cache/vaecf-data/ml-1m/ratings.dat"
    )
    a = ap.parse_args()
    home = tempfile.mkdtemp(prefix="vaecf-fit-budget-")
    os.environ["VAECF_HOME"] = home  # the fits' working directories: not the user's cache
    print(
        f"`python benchmarks/fit_budget.py --datasets {a.datasets} --seeds {a.seeds}"
        f"{' --reference-only' if a.reference_only else ' --reference' if a.reference else ''}`; "
        f"{machine()}\n"
    )
    head = "| dataset | seed | rows | budget s | wall s | winner | stopped | test " + METRIC
    a.reference = a.reference or a.reference_only
    head += " | edlae coarse points | each candidate's test |"
    head += (
        " reference wall s | its winner | its test | its candidates' test | diff |" * a.reference
    )
    print(head + "\n|" + "---|" * (head.count("|") - 1), flush=True)
    for name in a.datasets.split(","):
        df = frame(name, a)
        for seed in map(int, a.seeds.split(",")):
            if a.reference_only:
                got = {"wall": math.nan, "winner": "-", "stopped": "-", "test": math.nan}
                got.update(candidates_test={}, edlae_coarse_points=math.nan)
            else:
                got = one(df, seed, **({"budget": a.budget} if a.budget else {}))
            line = (
                f"| {name} | {seed} | {df.height:,} | {a.budget or default_budget(df.height):.0f} "
                f"| {got['wall']:.1f} | {got['winner']} | {got['stopped']} | {got['test']:.4f} "
                f"| {got['edlae_coarse_points']} | {alone(got)} |"
            )
            if a.reference:
                ref = one(df, seed, budget=1e9, patience=0)
                got["reference"] = ref
                line += (
                    f" {ref['wall']:.0f} | {ref['winner']} | {ref['test']:.4f} | {alone(ref)} "
                    f"| {got['test'] - ref['test']:+.4f} |"
                )
            print(line, flush=True)
            if a.out:
                a.out.mkdir(parents=True, exist_ok=True)
                (a.out / f"{name}-{seed}.json").write_text(json.dumps(got))


if __name__ == "__main__":
    main()
