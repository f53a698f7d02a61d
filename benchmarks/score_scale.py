"""`vaecf score` at ML-20M's scale, timed as whole processes.

    PYTHONPATH=src .venv/bin/python benchmarks/score_scale.py [--users 138000] [--items 20108]
        [--precision P ...] [--workdir DIR]

Writes an interactions file of ML-20M's shape (138,000 users by default, 20,108 items, ~10M
rows drawn with power-law item popularity and heavy-tailed user activity: `bench.synthetic_csr`)
as Parquet with user_id and item_id columns, a run directory holding an untrained Mult-VAE of
ML-20M's size ([600] hidden, 200-d latent: what trained weights cost), then runs
`vaecf score RUN --input FILE --out recs.parquet -k 100 --precision P` for each precision in
turn and prints the wall time, users/s, rows written and the peak memory (max RSS) of each.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vaecf.bench.hardware import cpu_name  # noqa: E402
from vaecf.bench.speed import ML20M, synthetic_csr  # noqa: E402
from vaecf.serve.fixtures import fresh_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=138_000)
    ap.add_argument("--items", type=int, default=ML20M["items"], help="catalogue (20,108)")
    ap.add_argument("--precision", action="append", help="repeat (default: fp32 bf16 int8)")
    ap.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vaecf-score-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "interactions.parquet"
    nnz = round(ML20M["nnz"] * a.users / ML20M["users"])
    if not src.exists():
        m = synthetic_csr(a.users, a.items, nnz, seed=0).tocoo()
        order = np.random.default_rng(1).permutation(m.nnz)  # users interleaved, as files come
        pl.DataFrame({"user_id": m.row[order] + 1, "item_id": m.col[order]}).write_parquet(src)
    run = work / "run"
    if not (run / "best.pt").exists():
        fresh_run(run, a.items, "multvae")
    rows = pl.scan_parquet(src).select(pl.len()).collect().item()
    print(f"CPU: {cpu_name()}; {a.users:,} users, {rows:,} interactions, {a.items:,} items")
    print(f"{'precision':>9} {'wall s':>8} {'users/s':>9} {'rows out':>11} {'max RSS MiB':>11}")
    for p in a.precision or ["fp32", "bf16", "int8"]:
        out = work / f"recs-{p}.parquet"
        cmd = [sys.executable, "-m", "vaecf", "score", str(run), "--input", str(src)]
        cmd += ["--out", str(out), "-k", "100", "--precision", p, "--quiet"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        n_out = pl.scan_parquet(out).select(pl.len()).collect().item()
        rss_txt = f"{rss / 1024:,.0f}" if rss > before else "<= previous"
        print(f"{p:>9} {wall:8.1f} {a.users / wall:9,.0f} {n_out:11,} {rss_txt:>11}")


if __name__ == "__main__":
    main()
