"""Accuracy on real data: MovieLens ml-latest-small with the paper's protocol, 5 seeds.

Protocol (issue 2): ratings >= 4 are positives, users with >= 5 positives, 50 validation + 50
test held-out users, seeds 98765, 1, 2, 3, 4 (each seeds both the split and the training).
Reference: the paper's own TensorFlow code reaches test NDCG@100 0.270 (mean of the same 5
seeds, sd 0.015); popularity ranking 0.177.

    python benchmarks/accuracy.py [--model multvae|multdae] [--precision fp32|bf16] [--epochs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import vaecf
from vaecf.data.matrix import CSR

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ml-latest-small"
SEEDS = (98765, 1, 2, 3, 4)
KEYS = ("recall@20", "recall@50", "ndcg@100")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="ml-latest-small directory")
    ap.add_argument("--model", default="multvae", choices=["multvae", "multdae"])
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument(
        "--train-seed-offset",
        type=int,
        default=0,
        help="train with seed + this (default 0: the split seed seeds training too)",
    )
    a = ap.parse_args()
    ratings = a.data / "ratings.csv"
    if not ratings.is_file():
        print(f"skipped: {ratings} not found")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in map(int, a.seeds.split(",")):
            t0 = time.perf_counter()
            ds = vaecf.prepare_csv(
                ratings,
                Path(tmp) / f"prep-{seed}",
                "userId",
                "movieId",
                "rating",
                settings=vaecf.PrepareSettings(
                    min_rating=4, min_user_items=5, heldout_users=50, seed=seed
                ),
            )
            res = vaecf.train(
                ds,
                vaecf.TrainConfig(
                    epochs=a.epochs,
                    seed=seed + a.train_seed_offset,
                    precision=a.precision,
                    progress=False,
                ),
                out=Path(tmp) / f"run-{seed}",
                model_config=vaecf.ModelConfig(model=a.model),
            )
            test = [CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te")]
            pop = vaecf.evaluate_scores(
                vaecf.popularity_scores(CSR.from_scipy(ds.split("train"))), *test
            )
            rows.append((seed, res.test_metrics, pop, res.best_epoch, time.perf_counter() - t0))
            m = res.test_metrics
            print(
                f"seed {seed:6d}  "
                + "  ".join(f"{k} {m[k]:.4f}" for k in KEYS)
                + f"  popularity ndcg@100 {pop['ndcg@100']:.4f}  best epoch {res.best_epoch}"
                f"  {rows[-1][-1]:.0f} s",
                file=sys.stderr,
            )
    print(f"\nml-latest-small, {a.model}, {a.precision}, {a.epochs} epochs, test users (n=50)")
    print(
        f"{'seed':>8s}" + "".join(f"{k:>11s}" for k in KEYS) + f"{'pop ndcg':>11s}{'best ep':>9s}"
    )
    for seed, m, pop, best, _ in rows:
        print(
            f"{seed:8d}" + "".join(f"{m[k]:11.4f}" for k in KEYS) + f"{pop['ndcg@100']:11.4f}"
            f"{best:9d}"
        )
    means = {k: statistics.mean(r[1][k] for r in rows) for k in KEYS}
    sd = statistics.stdev(r[1]["ndcg@100"] for r in rows) if len(rows) > 1 else 0.0
    pop_mean = statistics.mean(r[2]["ndcg@100"] for r in rows)
    print(f"{'mean':>8s}" + "".join(f"{means[k]:11.4f}" for k in KEYS) + f"{pop_mean:11.4f}")
    print(
        f"ndcg@100 sd {sd:.4f}; paper's TF code on this protocol: 0.270 (sd 0.015), "
        "popularity 0.177"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
