"""Serving copies side by side: batch-1 latency, and how far their rankings move from fp32's.

    PYTHONPATH=src .venv/bin/python benchmarks/serving_precision.py [--run RUN ...]
        [--items 20108] [--rounds 5] [--seconds 2] [--users 300]

Latency: `vaecf bench infer` (fold-in + mask of the history + top-100) of an ML-20M-sized
Mult-VAE (20,108 items by default, [600] hidden, 200-d latent, histories of 50 items) at
batch 1, the precisions taking turns for `--rounds` rounds of `--seconds` each (this machine
is shared and noisy: only ratios within one run compare); the table gives the median over
rounds of each round's mean and p99.

Agreement: for every trained run given, each held-out test user's fold-in history is scored by
each serving copy; "top-100 agreement" is the share of fp32's top 100 (history excluded) that
the copy also ranks in its top 100, averaged over users; and the test metrics of the copy
(`vaecf evaluate RUN --precision P`). The same for the untrained 20,108-item model on random
histories (no trained weights of that size at hand; random weights are a harder case for
agreement, their scores are close together).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vaecf import models  # noqa: E402
from vaecf.bench.hardware import cpu_name  # noqa: E402
from vaecf.bench.speed import bench_infer, synthetic_csr  # noqa: E402
from vaecf.data.matrix import CSR  # noqa: E402
from vaecf.data.prepare import PreparedDataset  # noqa: E402
from vaecf.evaluate import evaluate_model  # noqa: E402
from vaecf.models.serving import serving_copy  # noqa: E402
from vaecf.precision import native_bf16  # noqa: E402
from vaecf.rundir import load_config, load_model  # noqa: E402

PRECISIONS = ("fp32", "bf16", "int8")


def cpu_line() -> str:
    bf16 = "native bf16" if native_bf16(torch.device("cpu")) else "no native bf16"
    return f"{cpu_name()}, {torch.get_num_threads()} threads, {bf16}"


def latency(precisions, rounds: int, seconds: float, items: int = 20108) -> dict:
    got: dict = {p: [] for p in precisions}
    for _ in range(rounds):
        for p in precisions:
            r = bench_infer(items, (1,), p, "cpu", seconds=seconds, progress=False)[0]
            got[p].append((r["mean_ms"], r["p99_ms"]))
    return {
        p: (statistics.median(m for m, _ in v), statistics.median(q for _, q in v))
        for p, v in got.items()
    }


def top(fn, batch, k=100) -> torch.Tensor:
    with torch.inference_mode():
        s = fn(batch).float()
        s[batch.row_ids, batch.indices] = -torch.inf
        return s.topk(k, dim=1).indices


def agreement(make_model, fold_in: CSR, precisions, k: int = 100) -> dict:
    """{precision: mean share of fp32's top k in the copy's top k}, in batches of one user (the
    serving path)."""
    tops = {}
    rows = range(fold_in.n_rows)
    for p in precisions:
        _, fn = serving_copy(make_model(), p)
        tops[p] = [set(top(fn, fold_in.batch(torch.tensor([r])), k)[0].tolist()) for r in rows]
    return {
        p: float(np.mean([len(a & b) / k for a, b in zip(tops[p], tops["fp32"])])) for p in tops
    }


def run_rows(run: str, precisions) -> list[tuple]:
    cfg = load_config(run)
    ds = PreparedDataset(cfg["data"]["path"])
    fold_in, target = (
        CSR.from_scipy(ds.split(f"test_{p}"), torch.device("cpu")) for p in ("tr", "te")
    )
    agree = agreement(lambda: load_model(run, "cpu")[0], fold_in, precisions)
    rows = []
    for p in precisions:
        net, _ = serving_copy(load_model(run, "cpu")[0], p)
        m = evaluate_model(net, fold_in, target, precision=p if p == "fp32" else "fp32")
        rows.append(
            (
                f"{Path(run).name} ({cfg['model']['name']})",
                p,
                agree[p],
                m["ndcg@100"],
                m["recall@20"],
            )
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", default=[], help="trained run directories")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--users", type=int, default=300, help="random histories, untrained model")
    ap.add_argument("--items", type=int, default=20108, help="the untrained model's (20,108)")
    a = ap.parse_args()
    print(f"CPU: {cpu_line()}; torch {torch.__version__}")

    lat = latency(PRECISIONS, a.rounds, a.seconds, a.items)
    print(
        f"\nBatch-1 latency, {a.items:,}-item Mult-VAE, "
        f"median of {a.rounds} rounds x {a.seconds} s:"
    )
    print(f"{'precision':>9} {'mean ms':>8} {'p99 ms':>8} {'p99 vs fp32':>11} {'p99 vs bf16':>11}")
    for p, (mean, p99) in lat.items():
        vs32, vs16 = lat["fp32"][1] / p99, lat["bf16"][1] / p99
        print(f"{p:>9} {mean:8.3f} {p99:8.3f} {vs32:10.2f}x {vs16:10.2f}x")

    print("\nAgreement with fp32 (top 100, history excluded, batch 1) and test metrics:")
    print(f"{'model':>24} {'precision':>9} {'top-100 agr.':>12} {'NDCG@100':>9} {'Recall@20':>9}")
    for run in a.run:
        for name, p, agr, ndcg, r20 in run_rows(run, PRECISIONS):
            print(f"{name:>24} {p:>9} {agr:12.4f} {ndcg:9.4f} {r20:9.4f}")
    fold_in = CSR.from_scipy(
        synthetic_csr(a.users, a.items, a.users * 50, seed=3), torch.device("cpu")
    )

    def fresh():
        torch.manual_seed(0)
        return models.build("multvae", a.items)

    agree = agreement(fresh, fold_in, PRECISIONS)
    for p in PRECISIONS:
        print(f"{f'untrained {a.items:,} items':>24} {p:>9} {agree[p]:12.4f} {'-':>9} {'-':>9}")


if __name__ == "__main__":
    main()
