"""RP3beta (Paudel et al., 2016) and its blend with EDLAE on the prepared splits of a `vaecf
compare` run: RP3beta's (alpha, beta, top-k) chosen on validation; EDLAE (popularity penalty
0.1) with lambda and p chosen on validation over the whole grid; the blend of the two, each
scaled to unit standard deviation of the validation users' scores, its weight chosen on
validation. Test NDCG@100 per split and the means.

    python benchmarks/rp3beta.py --data DIR/filmtrust/data

RP3beta: W = P_iu^alpha P_ui^alpha (item -> user -> item transition probabilities, each entry
raised to alpha), columns divided by item popularity^beta, the diagonal zeroed, each row's top k
kept and normalised to sum 1; scores X W.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from linear_select_cv import linear_b, load_split, ndcg

L2 = [3, 10, 30, 100, 300, 1000, 3000, 10000]
PS = [0, 0.1, 0.2, 0.33, 0.5]
WEIGHTS = [0.1, 0.2, 0.3, 0.5]  # RP3beta's share of the blend


def rp3beta(x: sp.csr_matrix, alpha: float, beta: float, k: int) -> np.ndarray:
    users = np.maximum(np.asarray(x.sum(1)).ravel(), 1)
    items = np.maximum(np.asarray(x.sum(0)).ravel(), 1)
    p_ui = (sp.diags(1 / users) @ x).power(alpha)
    p_iu = (sp.diags(1 / items) @ x.T.tocsr()).power(alpha)
    w = (p_iu @ p_ui).toarray() / items[None, :] ** beta
    np.fill_diagonal(w, 0)
    if k < w.shape[0]:
        np.put_along_axis(w, np.argpartition(-w, k, axis=1)[:, k:], 0, axis=1)
    sums = w.sum(1, keepdims=True)
    return w / np.where(sums == 0, 1, sums)


def best(candidates, val) -> tuple[float, np.ndarray]:
    return max(((ndcg(*val, b), b) for b in candidates), key=lambda t: t[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a compare run's data directory")
    a = ap.parse_args()
    rows = []
    for path in sorted(Path(a.data).glob("seed-*")):
        _, val, test, x = load_split(path)
        g = (x.T @ x).toarray()
        penalty = np.maximum(np.diag(g), 1) ** -0.1
        edlae = (
            linear_b(g, l2, p, "edlae", np.float32) * penalty[None, :]
            for l2, p in itertools.product(L2, PS)
        )
        _, be = best(edlae, val)
        grid = itertools.product([0.5, 1.0], [0, 0.2, 0.4, 0.6], [50, 200, x.shape[1]])
        _, br = best((rp3beta(x, *params) for params in grid), val)
        fold_in = val[0].astype(np.float64)
        se, sr = np.std(fold_in @ be), np.std(fold_in @ br)
        _, bb = best(((1 - w) * be / se + w * br / sr for w in WEIGHTS), val)
        rows.append([ndcg(*test, b) for b in (be, br, bb)])
        e, r, b = rows[-1]
        print(f"{path.name}: EDLAE {e:.4f} RP3beta {r:.4f} blend {b:.4f}", flush=True)
    e, r, b = np.mean(rows, axis=0)
    print(f"mean: EDLAE {e:.4f} RP3beta {r:.4f} blend {b:.4f} ({b - e:+.4f})")


if __name__ == "__main__":
    main()
