"""Averaging EDLAE over its best validation points: the test NDCG@100 of the (lambda, p) that
validation picks against the mean of the B's of the m best validation points (a committee, to
lower the noise of choosing on few validation users), on the prepared splits of a `vaecf
compare` run. EDLAE with the default popularity penalty (beta 0.1), dense float32 solves over
the whole grid (lambda 1 to 10,000 x p 0 to 0.5), the Gram with the held-out fold-in rows.

    python benchmarks/linear_average.py --root DIR --datasets filmtrust,ml-latest-small
        [--m 1,2,3,5] [--seeds 98765,1,2,3,4]
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
from linear_select_cv import linear_b, load_split, ndcg

L2 = [1, 3, 10, 30, 100, 300, 1000, 3000, 10000]
PS = [0, 0.1, 0.2, 0.33, 0.5]
BETA = 0.1


def one_split(path: Path, ms: list[int]) -> tuple[dict, list]:
    _, val, test, x = load_split(path)
    g = (x.T @ x).toarray()
    penalty = np.maximum(np.diag(g), 1) ** -BETA
    points = []
    for l2, p in itertools.product(L2, PS):
        b = linear_b(g, l2, p, "edlae", np.float32) * penalty[None, :]
        points.append((ndcg(*val, b), l2, p, b))
    points.sort(key=lambda t: -t[0])  # best validation first
    return (
        {m: ndcg(*test, sum(t[3] for t in points[:m]) / m) for m in ms},
        [(t[1], t[2]) for t in points[: max(ms)]],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="a `vaecf compare --out` directory")
    ap.add_argument("--datasets", default="filmtrust,ml-latest-small")
    ap.add_argument("--m", default="1,2,3,5")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    a = ap.parse_args()
    ms = sorted({1, *(int(v) for v in a.m.split(","))})
    for name in a.datasets.split(","):
        rows = []
        for seed in a.seeds.split(","):
            t0 = time.perf_counter()
            got, top = one_split(a.root / name / "data" / f"seed-{seed}", ms)
            rows.append(got)
            each = " ".join(f"m{m} {v:.4f}" for m, v in got.items())
            print(
                f"{name} seed {seed}: {each}; best points {top} [{time.perf_counter() - t0:.0f} s]"
            )
        base = np.array([r[1] for r in rows])
        for m in ms[1:]:
            t = np.array([r[m] for r in rows])
            d = t - base
            print(
                f"{name} m={m}: {t.mean():.4f} against {base.mean():.4f} for the best point, "
                f"{d.mean():+.4f} (sd {d.std(ddof=1):.4f}), higher on {(d > 0).sum()}/{len(d)}"
            )


if __name__ == "__main__":
    main()
