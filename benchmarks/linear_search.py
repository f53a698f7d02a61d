"""The linear models' fit at 17,000 items: what the (lambda, p) search costs and gives up.

EASE and EDLAE fitted through `vaecf train` on one synthetic dataset (default: 17,000 items, 5,000
users, as the paper-library set of the accuracy issue), each search on the same split.

    python benchmarks/linear_search.py [--items 17000 --users 5000] [--grid] [--seed 0]
    python benchmarks/linear_search.py --solve-only 5000    # the CPU solvers side by side
    python benchmarks/linear_search.py --items 300 --users 400 --heldout 40 --coarse-items 50
    python benchmarks/linear_search.py --spin 28,20 --data DIR --rounds 2   # OpenBLAS's spin

Rows: EASE fast (the default), EDLAE fast (the default), and with --grid EASE over the full
9-value grid (9 full solves; ~8 minutes at 17,000 items on 2 cores). Columns: whole fit
seconds (Gram, search, final weights; not the test pass), full-catalogue solves, the choice,
validation and test NDCG@100. `--solve-only N`: one (N, N) regularised Gram inverted by
vaecf's CPU solver (scipy LAPACK) and by torch's cholesky + cholesky_inverse, in one process,
best of 3, float32 and float64. `--spin A,B`: EDLAE's search as `auto` runs it (cv selection,
auto's popularity penalties) on a prepared dataset (`--data`; default: the synthetic one), one
`vaecf train` process per OPENBLAS_THREAD_TIMEOUT value (OpenBLAS's threads spin 2^value cycles
after a call; vaecf sets 20 unless it is set), the values in turn for `--rounds` rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import vaecf
from vaecf import models
from vaecf.bench.hardware import cpu_name, machine
from vaecf.config.modelconfigs import LINEAR_CV_BETAS
from vaecf.data import synthetic
from vaecf.models.linalg import spd_inverse


def solve_only(n: int) -> None:
    x = (torch.rand(max(n // 2, 100), n, generator=torch.Generator().manual_seed(0)) < 0.02).float()
    gram = x.T @ x
    gram.diagonal().add_(100.0)
    print(f"{n:,} items; CPU: {cpu_name()}, {torch.get_num_threads()} threads")
    print("| dtype | scipy LAPACK s | torch s | ratio |\n|---|---:|---:|---:|")
    for dtype in (torch.float32, torch.float64):
        a = gram.to(dtype)
        ours = min(_timed(lambda a=a: spd_inverse(a.clone())) for _ in range(3))
        theirs = min(
            _timed(lambda a=a: torch.cholesky_inverse(torch.linalg.cholesky(a))) for _ in range(3)
        )
        print(f"| {str(dtype)[6:]} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f}x |")


def spin_table(data: Path, values: list[str], rounds: int) -> None:
    """EDLAE's cv search on `data`, a `vaecf train` process per OpenBLAS spin value, in turn."""
    betas = ",".join(f"{b:g}" for b in LINEAR_CV_BETAS)
    print(f"data: {data}; {machine()}")
    print("| round | OPENBLAS_THREAD_TIMEOUT | fit s | points | lambda | p | beta | val NDCG@100 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in range(rounds):
        for v in values:
            out = Path(tempfile.mkdtemp(prefix="linear_spin.")) / "run"
            cmd = [sys.executable, "-m", "vaecf", "train", "--data", str(data), "--model"]
            cmd += ["edlae", "--selection", "cv", "--popularity-grid", betas, "--out", str(out)]
            subprocess.run(
                cmd,
                env={**os.environ, "OPENBLAS_THREAD_TIMEOUT": v},
                check=True,
                capture_output=True,
            )
            rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
            points = len({(g["stage"], g["l2"], g["dropout"]) for g in rec["grid"]})
            print(
                f"| {r + 1} | {v} | {rec['fit_seconds']:.1f} | {points} | {rec['l2']:g} | "
                f"{rec['dropout']:g} | {rec['popularity_exponent']:g} | "
                f"{rec['validation']['ndcg@100']:.4f} |",
                flush=True,
            )


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=17_000)
    ap.add_argument("--users", type=int, default=5_000)
    ap.add_argument("--heldout", type=int, default=500, help="validation and test users each")
    ap.add_argument("--grid", action="store_true", help="also EASE over the full grid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--coarse-items",
        type=int,
        help="the fast search's coarse stage on this many items (vaecf's default: 3,000)",
    )
    ap.add_argument("--solve-only", type=int, metavar="N", help="time only the solvers at N items")
    ap.add_argument("--spin", help="OPENBLAS_THREAD_TIMEOUT values to compare (e.g. 28,20)")
    ap.add_argument("--data", type=Path, help="--spin: a prepared dataset's directory")
    ap.add_argument("--rounds", type=int, default=1, help="--spin: rounds of the values in turn")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if a.solve_only:
        solve_only(a.solve_only)
        return
    if a.spin and a.data:
        spin_table(a.data, a.spin.split(","), a.rounds)
        return
    root = Path(tempfile.mkdtemp(prefix="linear_search."))
    t0 = time.perf_counter()
    df = synthetic.generate(
        n_users=a.users, n_items=a.items, n_groups=40, mean_items=60, seed=a.seed
    )
    ds = vaecf.prepare_frame(
        df, root / "prep", vaecf.PrepareSettings(heldout_users=a.heldout, seed=a.seed)
    )
    print(
        f"data: {ds.n_items:,} items, {ds.manifest['counts']['n_train_users']:,} training users,"
        f" {ds.manifest['counts']['nnz_train']:,} interactions (prepared in "
        f"{time.perf_counter() - t0:.0f} s); CPU: {cpu_name()}, {torch.get_num_threads()} threads"
    )
    if a.spin:
        spin_table(root / "prep", a.spin.split(","), a.rounds)
        return
    fast = {} if a.coarse_items is None else {"coarse_items": a.coarse_items}
    rows = [("EASE fast", "ease", fast), ("EDLAE fast", "edlae", fast)]
    if a.grid:
        rows.append(("EASE grid", "ease", {"search": "grid"}))
    cfg = vaecf.TrainConfig(device="cpu", progress=False)
    print(
        "| search | fit s | full solves | lambda | p | val NDCG@100 | test NDCG@100 |\n"
        "|---|---:|---:|---:|---:|---:|---:|"
    )
    for label, name, settings in rows:
        res = vaecf.train(
            ds,
            cfg,
            root / label.replace(" ", "_"),
            models.config_from_dict(name, settings),
            model=name,
        )
        rec = json.loads((res.run_dir / "metrics.jsonl").read_text().splitlines()[0])
        n_full = sum(g["stage"] == "full" for g in rec["grid"])
        print(
            f"| {label} | {rec['fit_seconds']:.0f} | {n_full} | {rec['l2']:.3g} | "
            f"{rec.get('dropout', 0.0):g} | {res.validation_metrics['ndcg@100']:.4f} | "
            f"{res.test_metrics['ndcg@100']:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
