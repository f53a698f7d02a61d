"""A large catalogue through the CLI: wall time and peak memory of every stage.

    python benchmarks/catalogue_scale.py --out DIR [--users 300000] [--items 60000]
        [--mean-items 24] [--models ease,edlae,popular] [--heldout-users 10000]
        [--train-args "--solver sparse"]

Generates `vaecf.data.synthetic` data (planted taste groups, power-law popularity; written
once to DIR/data.csv), then runs `vaecf prepare csv`, `vaecf train --model M` for each model
(EASE and EDLAE pick their solver themselves: the sparse one where the dense n_items^2
arrays do not fit) and `vaecf score` over 10,000 users' histories, each as its own process
(peak RSS from wait4). Prints one row per stage: seconds, peak RSS, and for the models their
solver and test NDCG@100. Finished stages are reused when run again (delete DIR to redo).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VAECF = [sys.executable, "-m", "vaecf"]


def timed(cmd: list[str], log: Path) -> tuple[float, float]:
    """(seconds, peak RSS in GiB) of `cmd` run to completion; its output goes to `log`."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=f)
        _, status, usage = os.wait4(p.pid, 0)  # the child's own peak RSS (KiB on Linux)
        p.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}); see {log}:\n{log.read_text()[-2000:]}")
    return seconds, usage.ru_maxrss / 2**20  # KiB -> GiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--users", type=int, default=300_000)
    ap.add_argument("--items", type=int, default=60_000)
    ap.add_argument("--mean-items", type=float, default=24.0)  # median; mean ~30: ~9M in all
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--heldout-users", type=int, default=10_000)
    ap.add_argument("--models", default="ease,edlae,popular")
    ap.add_argument("--train-args", default="", help='more `vaecf train` flags: "--solver sparse"')
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    prep = a.out / "prep"
    rows = prepare(a, prep) + train(a, prep) + score(a, prep)
    counts = json.loads((prep / "manifest.json").read_text())["counts"]
    print(
        f"{a.items:,} items, {counts['n_train_users']:,} training users, "
        f"{counts['nnz_train']:,} training interactions; {os.cpu_count()} CPUs"
    )
    print(f"{'stage':<16s} {'seconds':>9s} {'peak RSS GiB':>13s} {'solver':>7s} {'NDCG@100':>9s}")
    for stage, s, rss, solver, ndcg in rows:
        print(f"{stage:<16s} {s:9.1f} {rss:13.2f} {solver:>7s} {ndcg:>9s}")


def prepare(a, prep: Path) -> list[tuple]:
    """The synthetic CSV and its prepared split in `prep`, each made unless already there;
    the preparation's row when timed."""
    csv = a.out / "data.csv"
    if not csv.is_file():
        from vaecf.data import synthetic

        t0 = time.perf_counter()
        df = synthetic.generate(
            n_users=a.users, n_items=a.items, n_groups=a.groups, mean_items=a.mean_items, seed=0
        )
        df.write_csv(csv)
        print(f"generated {df.height:,} interactions in {time.perf_counter() - t0:.0f} s")
    if (prep / "manifest.json").is_file():
        return []
    cmd = [*VAECF, "prepare", "csv", "--path", str(csv), "--out", str(prep)]
    cmd += ["--user-col", "user_id", "--item-col", "item_id"]
    cmd += ["--heldout-users", str(a.heldout_users)]
    s, rss = timed(cmd, a.out / "prepare.log")
    return [("prepare", s, rss, "", "")]


def train(a, prep: Path) -> list[tuple]:
    """One run per model not yet trained: its row (seconds, peak RSS, solver, test NDCG@100)."""
    rows = []
    for name in a.models.split(","):
        run = a.out / "runs" / name
        if not (run / "results.json").is_file():
            cmd = [*VAECF, "train", "--data", str(prep), "--out", str(run), "--model", name]
            cmd += [*a.train_args.split(), "--quiet"]
            s, rss = timed(cmd, a.out / f"train-{name}.log")
            res = json.loads((run / "results.json").read_text())
            lines = (run / "metrics.jsonl").read_text().splitlines()  # auto's: its candidates'
            solver = json.loads(lines[0]).get("solver", "") if lines else ""
            rows.append((f"train {name}", s, rss, solver, f"{res['test']['ndcg@100']:.4f}"))
    return rows


def score(a, prep: Path) -> list[tuple]:
    """The test users' fold-in histories (raw ids) scored by each run not yet scored."""
    histories = a.out / "histories.csv"
    if not histories.is_file():
        import polars as pl

        from vaecf.data.prepare import PreparedDataset

        ds = PreparedDataset(prep)
        x = ds.split("test_tr").tocoo()
        pl.DataFrame({"user": x.row, "item": ds.items.id_of(x.col)}).write_csv(histories)
    rows = []
    for name in a.models.split(","):
        scored = a.out / f"scores-{name}.csv"
        if not scored.is_file():
            cmd = [*VAECF, "score", str(a.out / "runs" / name), "--input", str(histories)]
            cmd += ["--out", str(scored), "--user-col", "user", "--item-col", "item"]
            s, rss = timed(cmd, a.out / f"score-{name}.log")
            rows.append((f"score {name}", s, rss, "", ""))
    return rows


if __name__ == "__main__":
    main()
