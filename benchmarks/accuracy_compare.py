"""Accuracy of every model on real and synthetic data through `vaecf compare`, paired by split.

Every model on the three visible real datasets (and the synthetic demo data), each through
`vaecf compare` (5 split seeds, paired differences and p-values to the first model), on the
paper's protocol.

    python benchmarks/accuracy_compare.py --out DIR [--datasets ml-latest-small,filmtrust,demo]
        [--models ease,edlae,auto,recvae,multvae,popular] [--seeds 98765,1,2,3,4]
        [--data-root ../shared/data] [--demo-users 12000 --demo-items 3000]
        [--ml1m ~/.cache/vaecf-data/ml-1m/ratings.dat]

Datasets (positives and held-out users chosen once, before any model was compared on them):
- ml-latest-small: MovieLens `ratings.csv`, ratings >= 4 (the paper's > 3.5), 50 + 50
  held-out users (~8% each of 603);
- filmtrust: FilmTrust's raw `ratings.txt` (`user item rating`, no header, 0.5-4 stars),
  ratings >= 3 (the top 3 of 8 steps, as >= 4 is on MovieLens' 10), 150 + 150 held-out users
  (~13% each of the 1,119 users with 5+ positives: fewer would leave the test mean to noise);
- ml-1m: MovieLens 1M's `ratings.dat` (`user::item::rating::time`, copied once into a CSV in
  DIR, since --sep takes one character), ratings >= 4 as the paper keeps on ML-20M, 600 + 600
  held-out users (`bash ../shared/data/ml-1m/fetch.sh` fetches it; --ml1m FILE);
- demo: `vaecf demo`'s synthetic data (12,000 users x 3,000 items, planted taste groups),
  1,200 + 1,200 held-out users (a tenth of the users each), 20 epochs for the gradient models
  as the demo trains.
Interrupted, it continues: compare reuses finished runs in DIR.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def demo_csv(out: Path, users: int = 12_000, items: int = 3_000) -> Path:
    name = "demo.csv" if (users, items) == (12_000, 3_000) else f"demo-{users}x{items}.csv"
    dst = out / name
    if not dst.is_file():
        from vaecf.data import synthetic

        synthetic.generate(n_users=users, n_items=items, seed=0).write_csv(dst)
    return dst


def ml1m_csv(out: Path, source: Path) -> Path:
    """ML-1M's `::`-separated ratings.dat as a CSV in `out` (made once)."""
    dst = out / "ml-1m-ratings.csv"
    if not dst.is_file():
        if not source.is_file():
            sys.exit(f"no {source}: run `bash ../shared/data/ml-1m/fetch.sh` or give --ml1m")
        tmp = dst.with_suffix(".part")
        with source.open(encoding="latin-1") as f, tmp.open("w") as w:
            w.write("user,item,rating,timestamp\n")
            for line in f:
                w.write(line.replace("::", ","))
        tmp.replace(dst)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--datasets", default="ml-latest-small,filmtrust,demo")
    ap.add_argument("--models", default="ease,edlae,auto,recvae,multvae,popular")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    ap.add_argument("--table", action="store_true", help="only print the table of finished runs")
    ap.add_argument(
        "--data-root",
        type=Path,
        default=SHARED,
        help="holds ml-latest-small/ratings.csv and filmtrust/ratings.txt",
    )
    ap.add_argument("--demo-users", type=int, default=12_000, help="demo data's users (12,000)")
    ap.add_argument("--demo-items", type=int, default=3_000, help="demo data's items (3,000)")
    ap.add_argument(
        "--ml1m", type=Path, default=Path.home() / ".cache/vaecf-data/ml-1m/ratings.dat"
    )
    a = ap.parse_args()
    if a.table:
        print(table(a.out, a.datasets.split(",")))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.datasets.split(","):
        path, args = source(a, name)
        cmd = [
            sys.executable,
            "-m",
            "vaecf",
            "compare",
            "--data",
            str(path),
            *args.split(),
            "--models",
            a.models,
            "--seeds",
            a.seeds,
            "--out",
            str(a.out / name),
            "--no-plot",
        ]
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, check=True)
    print(table(a.out, a.datasets.split(",")))


def source(a, name: str) -> tuple[Path, str]:
    """The ratings file of dataset `name` (made first for ml-1m and demo) and the `vaecf
    compare` flags that read and split it."""
    if name == "ml-latest-small":
        path = a.data_root / "ml-latest-small" / "ratings.csv"
        args = "--user-col userId --item-col movieId --rating-col rating --min-rating 4"
        return path, args + " --heldout-users 50"
    if name == "filmtrust":
        path = a.data_root / "filmtrust" / "ratings.txt"  # the raw file: no header, spaces
        args = "--no-header --columns user,item,rating --sep whitespace --min-rating 3"
        return path, args + " --heldout-users 150"
    if name == "ml-1m":
        path = ml1m_csv(a.out, a.ml1m)
        args = "--user-col user --item-col item --rating-col rating --min-rating 4"
        return path, args + " --heldout-users 600"
    if name == "demo":
        path = demo_csv(a.out, a.demo_users, a.demo_items)
        args = f"--user-col user_id --item-col item_id --heldout-users {a.demo_users // 10}"
        return path, args + " --epochs 20"
    sys.exit(f"unknown dataset {name}")


def table(out: Path, datasets: list[str], metric: str = "ndcg@100") -> str:
    """One markdown table: each model's test `metric` per dataset, mean ± sd over the splits,
    and its paired difference to the first model with the paired t-test's p-value."""
    from scipy import stats

    runs = {d: json.loads((out / d / "compare.json").read_text()) for d in datasets}
    labels = list(dict.fromkeys(lab for r in runs.values() for lab in r["labels"]))
    head = "| model | " + " | ".join(f"{d} {metric} | diff (p)" for d in datasets) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(datasets)]
    for lab in labels:
        cells = []
        for d in datasets:
            per = runs[d]["per_split"]
            if lab not in per:
                cells += ["", ""]
                continue
            v, ref = per[lab][metric], per[runs[d]["labels"][0]][metric]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):.4f} ± {sd:.4f}")
            diff = [a - b for a, b in zip(v, ref)]
            if lab == runs[d]["labels"][0]:
                cells.append("")
            elif len(v) < 2:
                cells.append(f"{statistics.mean(diff):+.4f}")
            else:
                p = stats.ttest_rel(v, ref).pvalue
                cells.append(f"{statistics.mean(diff):+.4f} ({p:.2f})")
        lines.append(f"| {lab} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
