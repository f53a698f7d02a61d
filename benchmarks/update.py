"""`vaecf update` against a full retrain: accuracy and wall time, side by side in one run.

A MovieLens ratings file ordered by time: its first 80% of interactions are the older export,
all of them the newer; both prepared with `--protocol temporal` (ratings >= 3.5). Each model is
trained on the older data (not timed), then, on the newer data, trained from scratch and
updated from the older run (`vaecf update`), each timed. Then the drift: `--rounds` updates in a
row over slices of time (from `--start` of the data to all of it), each from the last, against
one retrain on all of it. Times are of the calls in this one process, after the older run's
training: no interpreter start-up or first-call warm-up, which each command pays on its own.

    python benchmarks/update.py --source ~/.cache/vaecf-data/ml-1m/ratings.dat
    python benchmarks/update.py --source DIR/ratings.csv --models ease --rounds 2   # smoke
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import polars as pl

import vaecf
from vaecf.bench import hardware
from vaecf.data import parsers
from vaecf.training.update import update

ML1M = Path.home() / ".cache" / "vaecf-data" / "ml-1m" / "ratings.dat"


def read(source: Path) -> pl.DataFrame:
    """The ratings with their times, in time order (ties in file order)."""
    parse = parsers.read_movielens_dat if source.suffix == ".dat" else parsers.read_movielens_csv
    return parse([source])[0].sort("time", maintain_order=True)


def prepared(df: pl.DataFrame, share: float, out: Path):
    part = df.head(int(round(share * df.height)))
    settings = vaecf.PrepareSettings(protocol="temporal", min_rating=3.5, min_user_items=5)
    return vaecf.prepare_frame(part, out, settings)


def timed(fn):
    t0 = time.perf_counter()
    res = fn()
    return res, time.perf_counter() - t0


def one_model(name: str, old, new, tmp: Path, budget: float, patience=None) -> dict:
    cfg = vaecf.TrainConfig(progress=False, budget=budget)
    vaecf.train(old, cfg, tmp / f"{name}-old", model=name)
    full, t_full = timed(lambda: vaecf.train(new, cfg, tmp / f"{name}-full", model=name))
    upd, t_upd = timed(
        lambda: update(
            tmp / f"{name}-old", new, tmp / f"{name}-upd", budget, progress=False, patience=patience
        )
    )
    return {
        "model": name,
        "retrain": full.test_metrics["ndcg@100"],
        "update": upd.test_metrics["ndcg@100"],
        "t_retrain": t_full,
        "t_update": t_upd,
        "rows": changed_rows(upd),
    }


def drift(name: str, df: pl.DataFrame, tmp: Path, start: float, rounds: int, budget: float,
          patience=None):  # fmt: skip
    """(test NDCG@100 after `rounds` updates in a row, of one retrain on all the data; the
    wall time of the last update, of the retrain on the same data; the X^T X rows an EASE
    update changed)."""
    cfg = vaecf.TrainConfig(progress=False, budget=budget)
    shares = [start + (1.0 - start) * r / rounds for r in range(rounds + 1)]
    run = tmp / f"drift-{name}-0"
    vaecf.train(prepared(df, shares[0], tmp / "d0"), cfg, run, model=name)
    for r, share in enumerate(shares[1:], 1):
        ds = prepared(df, share, tmp / f"d{r}")
        t0 = time.perf_counter()
        res = update(run, ds, tmp / f"drift-{name}-{r}", budget, progress=False, patience=patience)
        last = time.perf_counter() - t0
        run = res.run_dir
    full, t_full = timed(lambda: vaecf.train(ds, cfg, tmp / f"drift-{name}-full", model=name))
    rows = changed_rows(res)
    return res.test_metrics["ndcg@100"], full.test_metrics["ndcg@100"], last, t_full, rows


def changed_rows(res) -> str:
    """The X^T X rows an EASE update changed ("added / removed"), "-" where it solved again."""
    fit = res.history[0]
    return f"{fit['rows_added']} / {fit['rows_removed']}" if "rows_added" in fit else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=ML1M, help="ratings.dat or ratings.csv")
    ap.add_argument("--models", default="ease,edlae,multvae,recvae")
    ap.add_argument("--drift-models", default="ease,multvae")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--start", type=float, default=0.5, help="share of the data drift starts at")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds per fit")
    ap.add_argument("--patience", type=int, help="an autoencoder update's (default: update's)")
    a = ap.parse_args()
    if not a.source.is_file():
        print(f"skipped: {a.source} not found")
        return 0
    df = read(a.source)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        old, new = prepared(df, 0.8, tmp / "old"), prepared(df, 1.0, tmp / "new")
        rows = [one_model(m, old, new, tmp, a.budget, a.patience) for m in a.models.split(",")]
        drifts = [(m, *drift(m, df, tmp, a.start, a.rounds, a.budget, a.patience))
                  for m in a.drift_models.split(",") if m]  # fmt: skip
    print(f"\n{hardware.machine()}")
    cmd = (f"python benchmarks/update.py --source {a.source.name} --models {a.models} "
           f"--drift-models '{a.drift_models}' --rounds {a.rounds} "
           f"--budget {a.budget:g}{f' --patience {a.patience}' if a.patience else ''}")  # fmt: skip
    print(f"command: {cmd}; older: the first 80% of the ratings by time, newer: all; temporal")
    print("| model | retrain NDCG@100 | update NDCG@100 | difference | retrain s | update s | "
          "update / retrain | X^T X rows added / removed |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['model']} | {r['retrain']:.4f} | {r['update']:.4f} | "
              f"{r['update'] - r['retrain']:+.4f} | {r['t_retrain']:.1f} | {r['t_update']:.1f} | "
              f"{r['t_update'] / r['t_retrain']:.0%} | {r['rows']} |")  # fmt: skip
    if drifts:
        print(f"\ndrift: {a.rounds} updates in a row from {a.start:.0%} of the data to all of it")
        print("| model | after the updates | one retrain | difference | the last update s | "
              "retrain s | update / retrain | its X^T X rows added / removed |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for m, u, f, tu, tf, rows in drifts:
            print(f"| {m} | {u:.4f} | {f:.4f} | {u - f:+.4f} | {tu:.2f} | {tf:.2f} | "
                  f"{tu / tf:.0%} | {rows} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
