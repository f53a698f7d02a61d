"""Seconds of one sparse-solver solve on a synthetic Gram, for source trees side by side.

One `neighbour_weights` solve (256 neighbours, 1,024 for the 2% most popular items) for one or
more source trees (each in its own process, in turn, `--rounds` times; the median is printed).

    python benchmarks/sparse_solve_time.py [--users 60000] [--items 15000] [--rounds 3] \\
        [--tree LABEL=PATH ...] [--device cpu --device cuda ...] [--rank count] [--profile]

--tree: a checkout's src directory to time (e.g. a `git worktree` of an earlier commit);
default: this tree's. --device: where the batched Cholesky solves run (default cpu; the
Gram and the neighbour choice stay on the host). --rank: the neighbour rank (default count,
which a tree from before the rank existed also solves with). Each tree is timed on each
device with each rank. --profile: one solve of the first tree under cProfile instead, its
largest costs (cumulative seconds) printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, sys, time
import numpy as np, scipy.sparse as sp, torch
from vaecf.data import synthetic
from vaecf.models.neighbourhood import neighbour_weights
users, items = int(sys.argv[1]), int(sys.argv[2])
df = synthetic.generate(n_users=users, n_items=items, n_groups=20, mean_items=30, seed=1)
_, u = np.unique(df["user_id"].to_numpy(), return_inverse=True)
_, i = np.unique(df["item_id"].to_numpy(), return_inverse=True)
x = sp.csr_matrix((np.ones(len(u), np.float32), (u, i)))
x.data[:] = 1.0
g = (x.T @ x).tocsr()
dev, rank = torch.device(sys.argv[3]), sys.argv[4]
kw = {} if rank == "count" else {"rank": rank}
solve = lambda: neighbour_weights(None, 100.0, 0.33, 256, dev, torch.float32, g, 0.02, 1024, **kw)
if len(sys.argv) > 5:  # --profile
    import cProfile, pstats
    cProfile.run("solve()", sys.argv[5])
    pstats.Stats(sys.argv[5]).sort_stats("cumulative").print_stats(14)
    raise SystemExit
if dev.type == "cuda":  # the device's start-up (context, kernels) is not the solve's
    head = g[:2000, :2000].tocsr()
    neighbour_weights(None, 100.0, 0.33, 256, dev, torch.float32, head, 0.02, 1024, **kw)
    torch.cuda.synchronize()
t = time.perf_counter()
solve()
if dev.type == "cuda":
    torch.cuda.synchronize()
print(json.dumps({"seconds": time.perf_counter() - t, "items": x.shape[1], "gram_nnz": g.nnz}))
"""


def path(src: str) -> str:
    """The tree's src first, then what PYTHONPATH already holds (packages installed aside)."""
    return os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=60000)
    ap.add_argument("--items", type=int, default=15000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], help="LABEL=SRC_DIR")
    ap.add_argument("--device", action="append", default=[], help="cpu, cuda (repeatable)")
    ap.add_argument("--rank", action="append", default=[], help="count, cosine (repeatable)")
    ap.add_argument("--profile", action="store_true", help="one solve under cProfile")
    a = ap.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = [t.split("=", 1) for t in a.tree] or [["this tree", here]]
    runs = [  # each tree on each device with each rank, labelled by what is given
        [", ".join([label, *([d] if a.device else []), *([r] if a.rank else [])]), src, d, r]
        for label, src in trees
        for d in a.device or ["cpu"]
        for r in a.rank or ["count"]
    ]
    if a.profile:
        with tempfile.TemporaryDirectory() as tmp:
            _, src, dev, rank = runs[0]
            env = {**os.environ, "PYTHONPATH": path(src)}
            cmd = [sys.executable, "-c", CHILD, str(a.users), str(a.items), dev, rank]
            cmd.append(f"{tmp}/solve.prof")
            subprocess.run(cmd, env=env, check=True)
        return
    times: dict[str, list[float]] = {run[0]: [] for run in runs}
    info = {}
    for _ in range(a.rounds):
        for label, src, dev, rank in runs:
            env = {**os.environ, "PYTHONPATH": path(src)}
            cmd = [sys.executable, "-c", CHILD, str(a.users), str(a.items), dev, rank]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            info = json.loads(out.stdout.strip().splitlines()[-1])
            times[label].append(info["seconds"])
    from vaecf.bench.hardware import cpu_name

    print(f"CPU: {cpu_name()}, {os.cpu_count()} CPUs")
    print(f"{info['items']:,} items, X^T X with {info['gram_nnz']:,} non-zeros")
    print("| tree | median s | per round |")
    print("|---|---:|---|")
    for label, ts in times.items():
        rounds = " ".join(f"{t:.1f}" for t in ts)
        print(f"| {label} | {statistics.median(ts):.1f} | {rounds} |")


if __name__ == "__main__":
    main()
