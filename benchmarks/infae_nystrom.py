"""inf-AE beyond --max-users (Nystrom, the sample alone) against EDLAE at a real set's size.

Test NDCG@100, seconds and peak memory of each, on planted tastes.

Synthetic data with planted taste groups (vaecf.data.synthetic), prepared as the paper's
protocol does (--heldout users each for validation and test, their histories split 80/20);
each model trained by `vaecf train` in its own process (its own peak RSS), with its defaults:
inf-AE with `--max-users` landmarks (10,000 by default) and every user a target (Nystrom), or
the landmarks alone (`--beyond-max-users sample`); EDLAE with its cv search.

    python benchmarks/infae_nystrom.py --out DIR [--users 55000] [--items 10000]
        [--heldout 5000] [--models infae,infae-sample,edlae] [--max-users 10000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from vaecf.bench.hardware import machine

MODELS = {
    "infae": ["--model", "infae"],
    "infae-sample": ["--model", "infae", "--beyond-max-users", "sample"],
    "edlae": ["--model", "edlae"],
}


def prepare(a) -> Path:
    out = a.out / f"data-{a.users}-{a.items}"
    if not (out / "manifest.json").is_file():
        import vaecf
        from vaecf.data import synthetic

        df = synthetic.generate(
            n_users=a.users, n_items=a.items, n_groups=40, mean_items=a.mean_items, seed=1
        )
        vaecf.prepare_frame(df, out, vaecf.PrepareSettings(heldout_users=a.heldout, seed=1))
    return out


# `vaecf train` in a child that prints its own peak RSS (KiB) last on stderr
CHILD = (
    "import resource, sys\nfrom vaecf.cli import main\nrc = main(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(rc)"
)


def run(name: str, data: Path, a) -> dict:
    out = a.out / f"run-{name}-{a.users}-{a.items}-{a.max_users}"
    cmd = [sys.executable, "-c", CHILD, "train", "--data", str(data), "--out", str(out)]
    cmd += MODELS[name]
    if name.startswith("infae"):
        cmd += ["--max-users", str(a.max_users)]
    t0 = time.perf_counter()
    got = subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    peak = int(got.stderr.decode().strip().splitlines()[-1]) / 2**20  # KiB -> GiB
    results = json.loads((out / "results.json").read_text())
    return {"wall": wall, "peak": peak, "test": results["test"]["ndcg@100"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--users", type=int, default=55000)
    ap.add_argument("--items", type=int, default=10000)
    ap.add_argument("--mean-items", type=int, default=60)
    ap.add_argument("--heldout", type=int, default=5000)
    ap.add_argument("--max-users", type=int, default=10000)
    ap.add_argument("--models", default="infae,infae-sample,edlae")
    a = ap.parse_args()
    data = prepare(a)
    print(
        f"`python benchmarks/infae_nystrom.py --users {a.users} --items {a.items} --heldout "
        f"{a.heldout} --max-users {a.max_users} --models {a.models}`; {machine()}\n"
    )
    print("| model | wall s (the whole `vaecf train`) | peak RSS GiB | test ndcg@100 |")
    print("|---|---:|---:|---:|", flush=True)
    for name in a.models.split(","):
        r = run(name, data, a)
        print(f"| {name} | {r['wall']:.0f} | {r['peak']:.2f} | {r['test']:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
