"""Early stopping: test NDCG@100 and time of `--patience P` runs against full-length runs.

Does a patience keep the test NDCG@100 of the full run, and how much time does it save? For
each dataset, model and split seed, trains once for --epochs with no early stopping, scoring
the test users after every epoch beside the validation users (the run's own choice of epoch
still sees validation only). A run with `--patience P` is exactly that run's prefix (the same
steps; tests/training/test_stopping.py checks it epoch for epoch), so every P is read off the
curves: where it stops, its best validated epoch up to there, that epoch's test NDCG@100 against the
full run's best validated epoch's, and the share of the full run's training and validation time.

    python benchmarks/early_stopping.py --out DIR [--datasets ml-latest-small,filmtrust,ml-1m]
        [--models multvae] [--seeds 98765,1,2,3,4] [--epochs 200] [--patience 5,10,20,30,50]

Datasets (as benchmarks/accuracy_compare.py prepares them): ml-latest-small (ratings >= 4,
50 + 50 held-out users), filmtrust (raw ratings.txt, >= 3 stars, 150 + 150), ml-1m (ratings.dat,
>= 4, 600 + 600; `bash ../shared/data/ml-1m/fetch.sh` or --ml1m FILE), demo (synthetic, small:
the smoke test's). Curves are kept in DIR (a rerun reuses them); `--table` prints from them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import vaecf
from vaecf import models
from vaecf.bench.hardware import machine
from vaecf.data import synthetic
from vaecf.data.matrix import CSR
from vaecf.evaluate import evaluate_model, metrics_with
from vaecf.training import single

METRIC = "ndcg@100"
ROOT = Path(__file__).resolve().parents[1]
PREPARE = {
    "ml-latest-small": "csv --path {root}/ml-latest-small/ratings.csv --user-col userId "
    "--item-col movieId --rating-col rating --min-rating 4 --heldout-users 50",
    "filmtrust": "csv --path {root}/filmtrust/ratings.txt --no-header --columns user,item,rating "
    "--sep whitespace --min-rating 3 --heldout-users 150",
    "ml-1m": "ml-1m --source {ml1m} --protocol liang --heldout-users 600",
}


def prepare(name: str, seed: int, a) -> vaecf.PreparedDataset:
    out = a.out / "data" / f"{name}-{seed}"
    if name == "demo":
        df = synthetic.generate(n_users=300, n_items=60, n_groups=3, mean_items=8, seed=seed)
        return vaecf.prepare_frame(df, out, vaecf.PrepareSettings(heldout_users=30, seed=seed))
    if not (out / "manifest.json").is_file():
        args = PREPARE[name].format(root=a.data_root, ml1m=a.ml1m).split()
        cmd = [sys.executable, "-m", "vaecf", "prepare", *args, "--seed", str(seed)]
        subprocess.run([*cmd, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return vaecf.PreparedDataset(out)


def curve(ds, model: str, seed: int, epochs: int, out: Path) -> list[dict]:
    """Per epoch: seconds (training + validation), validation and test METRIC."""
    cfg = vaecf.TrainConfig(epochs=epochs, patience=0, progress=False, device="cpu")
    cfg = single.resolve_config(cfg, models.get(model), ds.manifest["counts"]["n_train_users"])
    run = single.GradientFit(ds, cfg, model, models.config_from_dict(model), out)
    test = tuple(CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te"))
    rows, clock = [], [time.perf_counter()]

    def on_epoch(row):
        now = time.perf_counter()  # before the test users, which a real run does not score
        t = evaluate_model(run.model, *test, metrics_with(METRIC), cfg.eval_batch_size)
        rows.append(
            {"seconds": now - clock[0], "val": row["validation"][METRIC], "test": t[METRIC]}
        )
        clock[0] = time.perf_counter()

    run.on_epoch = on_epoch
    run.fit()
    return rows


def stop_of(rows: list[dict], patience: int) -> tuple[int, int]:
    """(epochs trained, best validated epoch), 1-based, of a run with `patience` (0: none)."""
    best, best_val = 0, -np.inf
    for e, r in enumerate(rows, 1):
        if r["val"] > best_val:
            best, best_val = e, r["val"]
        if patience and e - best >= patience:
            return e, best
    return len(rows), best


def table(a) -> str:
    lines = [
        f"`python benchmarks/early_stopping.py --out DIR --datasets {a.datasets} --models "
        f"{a.models} --seeds {a.seeds}"
        + (f" --epochs {a.epochs}" if a.epochs else "")
        + f"`; {machine()}",
        "",
        "| dataset | model | patience | epochs (mean) | time share | best epoch "
        f"| test {METRIC} vs all epochs: mean ± sd | worst | splits lower |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in a.datasets.split(","):
        for model in a.models.split(","):
            curves = [
                json.loads(p.read_text())
                for s in a.seeds.split(",")
                if (p := a.out / f"{name}-{model}-{s}-{a.epochs or 'default'}.json").is_file()
            ]
            if not curves:
                continue
            full = [rows[stop_of(rows, 0)[1] - 1]["test"] for rows in curves]
            for p in [0, *map(int, a.patience.split(","))]:
                stops = [stop_of(rows, p) for rows in curves]
                diff = np.array([rows[b - 1]["test"] for rows, (_, b) in zip(curves, stops)])
                diff -= full
                share = np.mean(
                    [
                        sum(r["seconds"] for r in rows[:n]) / sum(r["seconds"] for r in rows)
                        for rows, (n, _) in zip(curves, stops)
                    ]
                )
                lines.append(
                    f"| {name} ({len(curves)} splits) | {model} "
                    f"| {p or f'none ({len(curves[0])} epochs)'} "
                    f"| {np.mean([n for n, _ in stops]):.1f} | {share:.2f} "
                    f"| {np.mean([b for _, b in stops]):.1f} "
                    f"| {diff.mean():+.4f} ± {diff.std(ddof=1) if len(diff) > 1 else 0:.4f} "
                    f"| {diff.min():+.4f} | {(diff < 0).sum()} |"
                )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--datasets", default="ml-latest-small,filmtrust,ml-1m")
    ap.add_argument("--models", default="multvae")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    ap.add_argument("--epochs", type=int, help="default: the model's (Mult-VAE 200, RecVAE 50)")
    ap.add_argument("--patience", default="5,10,20,30,50")
    ap.add_argument("--data-root", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument(
        "--ml1m", type=Path, default=Path.home() / ".cache/vaecf-data/ml-1m/ratings.dat"
    )
    ap.add_argument("--table", action="store_true", help="print the table from DIR's curves")
    a = ap.parse_args()
    if not a.table:
        for name in a.datasets.split(","):
            for model in a.models.split(","):
                for seed in map(int, a.seeds.split(",")):
                    path = a.out / f"{name}-{model}-{seed}-{a.epochs or 'default'}.json"
                    if path.is_file():
                        continue
                    t0 = time.perf_counter()
                    ds = prepare(name, seed, a)
                    rows = curve(ds, model, seed, a.epochs, a.out / "runs" / path.stem)
                    path.write_text(json.dumps(rows))
                    print(f"{path.stem}: {time.perf_counter() - t0:.0f} s", flush=True)
    print(table(a))


if __name__ == "__main__":
    main()
