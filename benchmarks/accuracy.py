"""Accuracy on real data: every model on MovieLens ml-latest-small with the paper's protocol.

Protocol: ratings >= 4 are positives, users with >= 5 positives, 50 validation + 50 test
held-out users, split seeds 98765, 1, 2, 3, 4 (each seeds both the split and the training).
Reference: the paper's own TensorFlow Mult-VAE reaches test NDCG@100 0.270 (mean of the same 5
seeds, sd 0.015); popularity ranking 0.177.

    python benchmarks/accuracy.py                       # the default contenders below
    python benchmarks/accuracy.py --contender vae100 multvae batch_size=100 \\
                                  --contender ease ease l2=300 --seeds 98765,1

A contender is LABEL MODEL [SETTING=VALUE ...]; a setting is a TrainConfig field or one of the
model's config fields (values as JSON: 100, 0.5, [600], "paper").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import vaecf
from vaecf import models, rundir

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ml-latest-small"
SEEDS = (98765, 1, 2, 3, 4)
KEYS = ("recall@20", "recall@50", "ndcg@100")
DEFAULT_CONTENDERS = [
    ["popular", "popular"],
    ["ease", "ease"],
    ["multvae-paper", "multvae", "preset=paper"],
    ["multvae", "multvae"],
    ["recvae-paper", "recvae", "preset=paper"],
    ["recvae", "recvae"],
]


def parse_contender(spec: list[str]) -> tuple[str, str, dict, dict]:
    label, name, *pairs = spec
    train_names = {f.name for f in fields(vaecf.TrainConfig)}
    train, model = {}, {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        (train if key in train_names else model)[key] = value
    models.config_from_dict(name, model)  # fails early on a misspelt setting
    return label, name, train, model


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {sd:.4f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="ml-latest-small directory")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--contender", nargs="+", action="append", metavar="LABEL MODEL [K=V]")
    ap.add_argument("--precision", default="auto", help="training precision (default auto)")
    ap.add_argument("--json", type=Path, help="also write every run's metrics here")
    a = ap.parse_args()
    ratings = a.data / "ratings.csv"
    if not ratings.is_file():
        print(f"skipped: {ratings} not found")
        return 0
    contenders = [parse_contender(c) for c in (a.contender or DEFAULT_CONTENDERS)]
    seeds = [int(s) for s in a.seeds.split(",")]
    results: dict[str, list[dict]] = {c[0]: [] for c in contenders}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
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
            for label, name, train, model in contenders:
                out = Path(tmp) / f"{label}-{seed}"
                results[label].append(_one(ds, out, name, train, model, seed, a.precision))
                r = results[label][-1]
                print(
                    f"seed {seed:6d} {label:>14s}  "
                    + "  ".join(f"{k} {r['test'][k]:.4f}" for k in KEYS)
                    + f"  best epoch {r['best_epoch']}  {r['seconds']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    print(f"\nml-latest-small, test users (50 per seed), seeds {a.seeds}, precision {a.precision}")
    print(f"{'contender':>14s}" + "".join(f"{k:>18s}" for k in KEYS) + f"{'seconds':>9s}")
    for label, rows in results.items():
        print(
            f"{label:>14s}"
            + "".join(f"{mean_sd([r['test'][k] for r in rows]):>18s}" for k in KEYS)
            + f"{statistics.mean(r['seconds'] for r in rows):9.1f}"
        )
    print("\nper-seed test NDCG@100")
    print(f"{'contender':>14s}" + "".join(f"{s:>9d}" for s in seeds))
    for label, rows in results.items():
        print(f"{label:>14s}" + "".join(f"{r['test']['ndcg@100']:9.4f}" for r in rows))
    if a.json:
        a.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


def _one(ds, out: Path, name: str, train: dict, model: dict, seed: int, precision: str) -> dict:
    """One contender trained on one split: its test metrics, best epoch, seconds, settings."""
    t0 = time.perf_counter()
    cfg = vaecf.TrainConfig(**{"seed": seed, "precision": precision, "progress": False, **train})
    res = vaecf.train(ds, cfg, out, models.config_from_dict(name, model), model=name)
    return {
        "seed": seed,
        "test": res.test_metrics,
        "best_epoch": res.best_epoch,
        "seconds": time.perf_counter() - t0,
        "train": rundir.load_config(res.run_dir)["train"],
    }


if __name__ == "__main__":
    raise SystemExit(main())
