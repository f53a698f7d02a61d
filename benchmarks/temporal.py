"""Every model judged on the future: a time protocol's test period, every metric vaecf has.

Prepares a time-stamped dataset under `--protocol temporal` (the last 10% of the positives by
time are the test period, the 10% before them validation) or `last` (leave-last-out), trains
each model with its defaults within `--budget` seconds, and scores its test period with the
accuracy metrics and the beyond-accuracy ones (novelty, coverage, Gini). The validation column
is what `auto` chose by.

    python benchmarks/temporal.py --data ml-1m                  # ~/.cache/vaecf-data/ml-1m
    python benchmarks/temporal.py --data ml-latest-small --protocol last
    python benchmarks/temporal.py --data ml-latest-small --models popular,ease --budget 30
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import vaecf
from vaecf.bench import hardware
from vaecf.run_evaluation import evaluate_run

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {
    "ml-latest-small": ROOT.parent / "shared" / "data" / "ml-latest-small",
    "ml-1m": Path.home() / ".cache" / "vaecf-data" / "ml-1m",
}
MODELS = "popular,ease,edlae,infae,multvae,multdae,recvae,auto"
METRICS = ("recall@20", "ndcg@100", "precision@10", "map@10", "mrr@10", "hit@10")
BEYOND = ("novelty@10", "coverage@10", "gini@10")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", choices=sorted(SOURCES), default="ml-latest-small")
    ap.add_argument("--source", type=Path, help="the dataset's raw files (default: see above)")
    ap.add_argument("--protocol", choices=("temporal", "last"), default="temporal")
    ap.add_argument("--models", default=MODELS, help=f"comma-separated (default {MODELS})")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds per model")
    ap.add_argument("--min-rating", type=float, default=3.5)
    a = ap.parse_args()
    source = a.source or SOURCES[a.data]
    if not source.exists():
        print(f"skipped: {source} not found")
        return 0
    settings = vaecf.data.preprocess.dataset_settings(
        a.data, protocol=a.protocol, min_rating=a.min_rating
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ds = vaecf.prepare_dataset(a.data, source, Path(tmp) / "data", settings, progress=False)
        for name in a.models.split(","):
            rows.append(_one(ds, name, Path(tmp) / name, a.budget))
    c = ds.manifest["counts"]
    print(f"\n{hardware.machine()}")
    print(
        f"{a.data}, --protocol {a.protocol}, ratings >= {a.min_rating:g}: {c['n_train_users']} "
        f"training users, {c['n_items']} items; {c['n_validation_users']} validation and "
        f"{c['n_test_users']} test users; --budget {a.budget:g} s a model"
    )
    print(f"command: python benchmarks/temporal.py --data {a.data} --protocol {a.protocol}")
    keys = ("val ndcg@100", *METRICS, *BEYOND, "seconds")
    w = max(len(r["model"]) for r in rows)
    print(f"{'model':>{w}s}" + "".join(f"{k:>13s}" for k in keys))
    for r in rows:
        print(f"{r['model']:>{w}s}" + "".join(_cell(r[k]) for k in keys))
    return 0


def _cell(v) -> str:
    return f"{v:13.1f}" if isinstance(v, float) and v > 10 else f"{v:13.4f}"


def _one(ds, name: str, out: Path, budget: float) -> dict:
    t0 = time.perf_counter()
    cfg = vaecf.TrainConfig(progress=False, budget=budget)
    res = vaecf.train(ds, cfg, out, model=name)
    seconds = time.perf_counter() - t0
    ev = evaluate_run(out, metrics=(*METRICS, *BEYOND))
    results = json.loads((out / "results.json").read_text())
    winner = results.get("auto", {}).get("winner")
    if winner is not None:  # what auto chose from, on validation
        seen = [(c["model"], c["validation"]["ndcg@100"]) for c in results["auto"]["candidates"]
                if c.get("validation")]  # fmt: skip
        print("auto's candidates, validation ndcg@100: "
              + ", ".join(f"{m} {v:.4f}" for m, v in seen) + f"; kept {winner}")  # fmt: skip
    return {
        "model": name if winner is None else f"auto ({winner})",
        "val ndcg@100": res.validation_metrics["ndcg@100"],
        **{k: ev.summary[k] for k in (*METRICS, *BEYOND)},
        "seconds": seconds,
    }


if __name__ == "__main__":
    raise SystemExit(main())
