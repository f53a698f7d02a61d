"""Where a whole `vaecf train` spends its wall time, and how many bytes it writes.

    python benchmarks/run_time.py [--before SRC_DIR] [--epochs 200] [--precision auto]
                                  [--datasets ml-latest-small,citeulike-a] [--device cuda]

Runs `vaecf train` as a separate process on two datasets: ml-latest-small (the accuracy
protocol, split seed 98765; skipped when ../shared is absent) and a synthetic dataset of
citeulike-a's size (5,551 users, 16,980 items, ~205k interactions), with the paper's settings
given explicitly (200 epochs and no early stopping, batch 500, lr 1e-3, 200,000 annealing steps,
cap 0.2) so that every
version of the code trains the same model. `--before SRC_DIR` runs another checkout's `src` (e.g.
a worktree of an older commit) first, for a before/after table measured side by side;
`--variant LABEL=ARGS` (repeatable) runs this code with extra train arguments as well (with
`--model recvae` among them: the same settings without Mult-VAE's annealing).

Columns: the process's wall time; the time in training steps (the sum of metrics.jsonl's
`train_seconds`); wall / steps; the other phases from results.json's `timing` where the code
records it (setup, validation, checkpoint waits, test; start-up = wall - total: imports, reading
the data, exit); and the bytes the process wrote (`wchar` of /proc/self/io); the first layer's
kernel, the rows trained on an epoch and the test NDCG@100 from results.json.

`--datasets ml-20m` adds a synthetic set of ML-20M's shape (136,677 users, 20,108 items, 10M
interactions; 10,000 + 10,000 held-out users as in the paper): the paper's whole ML-20M run.
`--synthetic USERS,ITEMS,NNZ,HELDOUT` adds a synthetic set of any shape (a tiny one: a smoke
run, `--datasets "" --synthetic 300,200,3000,30 --epochs 1`).
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

import numpy as np
import polars as pl

import vaecf
from vaecf.bench.hardware import cpu_name, device_name
from vaecf.bench.speed import synthetic_csr
from vaecf.precision import resolve_device

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "ml-latest-small" / "ratings.csv"
WRAPPER = """
import atexit, sys
def report():
    io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    sys.stderr.write(f"\\n__wchar__ {io['wchar']}\\n")
atexit.register(report)
from vaecf.cli import main
code = main(sys.argv[1:])
sys.exit(code)
"""


def datasets(tmp: Path, names: list[str], extra: list[str] = ()) -> dict[str, Path]:
    out = {}
    if "ml-latest-small" in names and SHARED.is_file():
        out["ml-latest-small"] = vaecf.prepare_csv(
            SHARED,
            tmp / "ml",
            "userId",
            "movieId",
            "rating",
            settings=vaecf.PrepareSettings(min_rating=4, heldout_users=50, seed=98765),
        ).path
    shapes = {
        "citeulike-a": (5_551, 16_980, 204_986, 500),
        "ml-20m": (136_677, 20_108, 10**7, 10**4),
    }
    for shape in extra:
        users, items, nnz, heldout = (int(v) for v in shape.split(","))
        shapes[f"{users}x{items}"] = (users, items, nnz, heldout)
        names = [*names, f"{users}x{items}"]
    for name in names:
        if name in shapes:
            users, items, nnz, heldout = shapes[name]
            m = synthetic_csr(users, items, nnz, seed=0).tocoo()
            df = pl.DataFrame(
                {"user_id": m.row.astype(np.int64), "item_id": m.col.astype(np.int64)}
            )
            out[f"{name} size"] = vaecf.prepare_frame(
                df, tmp / name, vaecf.PrepareSettings(heldout_users=heldout, seed=0)
            ).path
    return out


def run(
    src: Path, data: Path, out: Path, epochs: int, precision: str, device: str, extra=()
) -> dict:
    model = extra[extra.index("--model") + 1] if "--model" in extra else "multvae"
    anneal = ["--total-anneal-steps", "200000", "--anneal-cap", "0.2"]  # Mult-VAE's
    args = [
        "train", "--data", str(data), "--out", str(out), "--epochs", str(epochs),
        "--batch-size", "500", "--lr", "1e-3", *(anneal if model == "multvae" else ()),
        "--seed", "98765", "--precision", precision, "--device", device, "--quiet",
        "--patience", "0", *extra,
    ]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-c", WRAPPER, *args], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"vaecf train failed:\n{p.stderr[-3000:]}")
    wchar = int(p.stderr.rsplit("__wchar__", 1)[1].split()[0])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    results = json.loads((out / "results.json").read_text())
    timing = results.get("timing", {})
    if "total_s" in timing:  # imports, reading the data, exit
        timing["startup_s"] = wall - timing["total_s"]
    return {
        "wall": wall,
        "steps": sum(r["train_seconds"] for r in rows),
        "timing": timing,
        "bytes": wchar,
        "ndcg": (results.get("test") or {}).get("ndcg@100", float("nan")),
        "first_layer": results.get("first_layer", {}).get("kernel", "-"),
        "rows": results.get("train_rows", 0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout's src directory")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    ap.add_argument("--datasets", default="ml-latest-small,citeulike-a", help="also: ml-20m")
    ap.add_argument(
        "--synthetic",
        action="append",
        default=[],
        metavar="USERS,ITEMS,NNZ,HELDOUT",
        help="also a synthetic set of this shape (repeatable)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=ARGS",
        help="also this code with these train arguments, e.g. 'eager=--cuda-graphs false'",
    )
    ap.add_argument("--only-variants", action="store_true", help="not this code's plain run")
    a = ap.parse_args()
    versions = ([("before", a.before, ())] if a.before else []) + [
        (label, ROOT / "src", tuple(args.split()))
        for label, args in (v.split("=", 1) for v in a.variant)
    ]
    if not a.only_variants:
        versions.append(("after", ROOT / "src", ()))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in datasets(Path(tmp), a.datasets.split(","), a.synthetic).items():
            for label, src, extra in versions:
                out = Path(tmp) / f"run-{label}-{len(rows)}"
                r = run(src, data, out, a.epochs, a.precision, a.device, extra)
                rows.append((name, label, r))
                print(f"{name} {label}: {r['wall']:.1f} s wall", file=sys.stderr, flush=True)
    dev = resolve_device(a.device)
    on = device_name(dev) + (f" (CPU {cpu_name()})" if dev.type == "cuda" else "")
    print(f"\nvaecf train, {a.epochs} epochs, precision {a.precision}, on {on}")
    head = ("data", "code", "wall s", "steps s", "wall/steps", "start-up", "setup", "valid.")
    head += ("ckpt wait", "test")
    print(
        f"{head[0]:>17s} {head[1]:>7s}"
        + "".join(f"{h:>11s}" for h in head[2:])
        + "   written  rows/epoch  graph steps  first layer  test NDCG@100"
    )
    for name, label, r in rows:

        def fmt(key: str, t: dict = r["timing"]) -> str:
            return f"{t[key]:11.2f}" if key in t else f"{'-':>11s}"

        print(
            f"{name:>17s} {label:>7s}{r['wall']:11.1f}{r['steps']:11.1f}"
            f"{r['wall'] / r['steps']:11.2f}{fmt('startup_s')}{fmt('setup_s')}"
            f"{fmt('validation_s')}{fmt('checkpoint_wait_s')}{fmt('test_s')}"
            f"{r['bytes'] / 2**20:9.0f} MiB{r['rows']:12,d}"
            f"{r['timing'].get('graph_steps', '-'):>13}{r['first_layer']:>13s}{r['ndcg']:15.4f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
