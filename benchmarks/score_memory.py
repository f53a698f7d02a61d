"""`vaecf score --out DIR/` at growing user counts: peak memory (max RSS) must stay flat.

    python benchmarks/score_memory.py [--users 200000,800000,3200000,10000000] [--items 5000]
        [--per-user 10] [-k 10] [--model ease] [--file] [--workdir DIR] [--device cuda]
        [--batch-users 1024]

For each user count, an interactions file (Parquet, user_id and item_id, `--per-user` rows a
user on average, power-law items and heavy-tailed users: `bench.synthetic_csr`, users
interleaved as files come) is scored by a run of an untrained `--model` over `--items` items
(what trained weights cost) into a directory of parts, each as its own process; the table
gives its wall time, users/s, rows written and peak RSS, and that peak against the first
row's. `--file` also writes one .parquet file at each count (the parts merged at the end).
On a GPU (`--device cuda`) the table adds the process's peak GPU memory (PyTorch's allocator).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vaecf.bench.hardware import machine  # noqa: E402
from vaecf.bench.speed import synthetic_csr  # noqa: E402
from vaecf.serve.fixtures import fresh_run  # noqa: E402

SLICE = 1_000_000  # users generated at once
# the command in a child that reports its own peak RSS (KiB on Linux) on its last line
MEASURED = (
    "import resource, runpy, sys\n"
    "sys.argv = ['vaecf', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('vaecf', run_name='__main__')\n"
    "finally:\n    print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    "    import torch\n"
    "    print('maxgpu', torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else 0)\n"
)


def interactions(path: Path, users: int, items: int, per_user: int) -> int:
    """Write the file (in slices of SLICE users, each interleaved); returns its rows."""
    if not path.exists():
        parts = []
        for s, first in enumerate(range(0, users, SLICE)):
            n = min(SLICE, users - first)
            m = synthetic_csr(n, items, n * per_user, seed=s).tocoo()
            order = np.random.default_rng(s).permutation(m.nnz)
            part = path.with_name(f"{path.stem}.{s}.parquet")
            pl.DataFrame(
                {"user_id": m.row[order] + first + 1, "item_id": m.col[order]}
            ).write_parquet(part)
            parts.append(part)
        pl.concat([pl.scan_parquet(p) for p in parts]).sink_parquet(path)
        for p in parts:
            p.unlink()
    return pl.scan_parquet(path).select(pl.len()).collect().item()


def score(run: Path, src: Path, out: Path, a) -> tuple[float, int, int, dict]:
    """Wall s, peak RSS KiB, peak GPU bytes and the --json answer of one `vaecf score`."""
    cmd = [sys.executable, "-c", MEASURED, "score", str(run), "--input", str(src), "--out",
           str(out), "-k", str(a.k), "--quiet", "--json", "--device", a.device,
           "--batch-users", str(a.batch_users)]  # fmt: skip
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    lines = p.stdout.strip().splitlines()
    rss, gpu = (int(line.split()[1]) for line in lines[-2:])
    return wall, rss, gpu, json.loads("\n".join(lines[:-2]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", default="200000,800000,3200000,10000000")
    ap.add_argument("--items", type=int, default=5000)
    ap.add_argument("--per-user", type=int, default=10)
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--model", default="ease")
    ap.add_argument("--file", action="store_true", help="also score into one .parquet file")
    ap.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-users", type=int, default=1024, help="users per scoring call")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vaecf-score-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    run = work / f"run-{a.model}-{a.items}"
    if not (run / "best.pt").exists():
        fresh_run(run, a.items, a.model)
    print(machine())
    also = " --file" if a.file else ""
    print(f"command: python benchmarks/score_memory.py --users {a.users} --items {a.items} "
          f"--per-user {a.per_user} -k {a.k} --model {a.model}{also} --device {a.device} "
          f"--batch-users {a.batch_users}")  # fmt: skip
    print("| users | interactions | output | wall s | users/s | parts | rows out | peak RSS GiB "
          "| vs first | peak GPU GiB |")  # fmt: skip
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    first = None
    for users in (int(u) for u in a.users.split(",")):
        src = work / f"interactions-{users}-{a.items}-{a.per_user}.parquet"
        rows = interactions(src, users, a.items, a.per_user)
        outs = [work / f"recs-{users}"] + ([work / f"recs-{users}.parquet"] if a.file else [])
        for out in outs:
            subprocess.run(["rm", "-rf", str(out)], check=True)
            wall, rss, gpu, res = score(run, src, out, a)
            first = first or rss
            kind = "file" if out.suffix else "parts"
            print(f"| {users:,} | {rows:,} | {kind} | {wall:.1f} | {users / wall:,.0f} | "
                  f"{res.get('chunks', 1)} | {res['rows']:,} | {rss / 2**20:.2f} | "
                  f"{rss / first:.2f}x | {gpu / 2**30:.2f} |", flush=True)  # fmt: skip
            subprocess.run(["rm", "-rf", str(out)], check=True)


if __name__ == "__main__":
    main()
