"""inf-AE's fit at growing user counts: seconds and peak memory of one fit, a process per size.

One fit of `--model infae` on synthetic data with planted taste groups, one process per size
(each its own peak RSS).

A fit holds a users x users kernel and its Cholesky factor and solves for a users x items
right-hand side: U^3 / 3 for the factor and 2 U^2 n for the solve. With --search, each of
--ridge-grid's 9 lambdas and the 2 bisections after them costs its factor and a solve for the
validation users' kernel rows; the users x items solve is made once, for the winner.

    python benchmarks/infae_scale.py [--users 2500,5000,10000] [--items 20000] [--ridge 1]
        [--search 1000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def split_80_20(x, rng):
    """Each row's items split 80/20 at random (fold-in, target), as held-out users are."""
    import scipy.sparse as sp

    x = x.tocoo()
    keep = rng.random(x.nnz) < 0.8
    part = [sp.csr_matrix((x.data[m], (x.row[m], x.col[m])), shape=x.shape) for m in (keep, ~keep)]
    return part[0], part[1]


def one(users: int, items: int, ridge: float, dtype: str, search: int) -> dict:
    import numpy as np
    import scipy.sparse as sp
    import torch

    from vaecf import models
    from vaecf.data import synthetic
    from vaecf.models.infae import fit_bytes

    df = synthetic.generate(n_users=users, n_items=items, n_groups=40, mean_items=60, seed=1)
    u = np.unique(df["user_id"].to_numpy(), return_inverse=True)[1]
    i = df["item_id"].to_numpy()
    x = sp.csr_matrix((np.ones(len(u), np.float32), (u, i)), shape=(u.max() + 1, items))
    x.sum_duplicates()
    x.data[:] = 1.0
    settings = {"kernel_dtype": dtype, **({} if search else {"ridge": ridge})}
    model = models.build("infae", items, settings)
    validation = None
    if search:  # the last `search` users held out, 80/20, as the validation split
        validation = split_80_20(x[-search:], np.random.default_rng(2))
        x = x[:-search]
    t0 = time.perf_counter()
    rec = model.fit(x, validation=validation)
    fit_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {
        "users": rec["users"],
        "items": items,
        "nnz": int(x.nnz),
        "fit_s": round(fit_s, 1),
        "peak_gib": round(peak, 2),
        "estimate_gib": round(fit_bytes(rec["users"], items, getattr(torch, dtype)) / 2**30, 2),
        "threads": torch.get_num_threads(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", default="2500,5000,10000")
    ap.add_argument("--items", type=int, default=20000)
    ap.add_argument("--ridge", type=float, default=1.0)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument(
        "--search",
        type=int,
        default=0,
        help="hold out this many users as a validation split and search --ridge-grid's 9 "
        "lambdas (and 2 bisections) on them instead of fitting --ridge",
    )
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one size
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.items, a.ridge, a.dtype, a.search)))
        return 0
    what = f"9 + 2 lambdas on {a.search:,} validation users" if a.search else "one lambda"
    from vaecf.bench.hardware import cpu_name

    print(f"CPU: {cpu_name()}; kernel {a.dtype}, {what}")
    print("| users | items | interactions | fit s | peak RSS GiB | estimate GiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for users in (int(v) for v in a.users.split(",")):
        cmd = [sys.executable, __file__, "--one", str(users), "--items", str(a.items)]
        cmd += ["--ridge", str(a.ridge), "--dtype", a.dtype, "--search", str(a.search)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        print(
            f"| {r['users']:,} | {r['items']:,} | {r['nnz']:,} | {r['fit_s']} | "
            f"{r['peak_gib']} | {r['estimate_gib']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
