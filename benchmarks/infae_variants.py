"""inf-AE's kernel variants on the prepared splits of a `vaecf compare` run: the neural tangent
kernel of a ReLU network with 1, 2 or 3 hidden layers, on the raw rows or on rows scaled to
unit length first; float64 numpy, the ridge chosen on validation NDCG@100 from inf-AE's grid,
fitted on the training rows and both fold-ins (as `--model infae` is). Test NDCG@100 per
split and its mean.

    python benchmarks/infae_variants.py --data DIR/filmtrust/data [--seeds 98765,1,2,3,4]
        [--variants 1,1n,2,3]        # depth, "n": unit-length rows
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from linear_select_cv import load_split

from vaecf.data.matrix import CSR
from vaecf.evaluate import evaluate_scores
from vaecf.specs import InfAEConfig

GRID = InfAEConfig().ridge_grid


def ntk(dot: np.ndarray, na: np.ndarray, nb: np.ndarray, depth: int) -> np.ndarray:
    """The NTK of a bias-free ReLU network with `depth` hidden layers (Jacot et al. 2018):
    Sigma_h from the arc-cosine kernel of order 1 of Sigma_{h-1}, its derivative kernel of
    order 0, Theta_h = Theta_{h-1} Sigma'_h + Sigma_h; depth 1 is models/infae.ntk."""
    sig, saa, sbb, theta = dot, na**2, nb**2, dot
    for _ in range(depth):
        scale = np.sqrt(np.outer(saa, sbb))
        cos = np.clip(sig / np.maximum(scale, 1e-300), -1.0, 1.0)
        t = np.arccos(cos)
        sig = scale * (np.sin(t) + (np.pi - t) * cos) / (2 * np.pi)
        theta = theta * (np.pi - t) / (2 * np.pi) + sig
        saa, sbb = saa / 2, sbb / 2  # Sigma_h(x, x) = Sigma_{h-1}(x, x) / 2
    return theta


def one_split(path: Path, depth: int, unit: bool) -> tuple[float, float]:
    _, val, test, x = load_split(path)
    xd = x.toarray()
    xd = xd[xd.sum(1) > 0]
    if unit:
        xd = xd / np.linalg.norm(xd, axis=1, keepdims=True)
    norms = np.linalg.norm(xd, axis=1)
    k = ntk(xd @ xd.T, norms, norms, depth)
    m = np.diag(k).mean()

    def scorer(alpha):
        def fn(batch):
            rows = torch.zeros(batch.batch_size, xd.shape[1], dtype=torch.float64)
            rows.index_put_((batch.row_ids, batch.indices), batch.values.double())
            rows = rows.numpy()
            n = np.linalg.norm(rows, axis=1)
            if unit:
                rows, n = rows / np.maximum(n, 1e-12)[:, None], (n > 0).astype(float)
            return torch.from_numpy(ntk(rows @ xd.T, n, norms, depth) @ alpha).float()

        return fn

    def f32(m_):
        return CSR.from_scipy(m_.astype(np.float32))

    best = None
    for ridge in GRID:
        alpha = np.linalg.solve(k + ridge * m * np.eye(len(k)), xd)
        v = evaluate_scores(scorer(alpha), f32(val[0]), f32(val[1]))["ndcg@100"]
        if best is None or v > best[0]:
            best = (v, ridge, alpha)
    t = evaluate_scores(scorer(best[2]), f32(test[0]), f32(test[1]))["ndcg@100"]
    return t, best[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a compare run's DIR/D/data")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    ap.add_argument("--variants", default="1,1n,2,3")
    a = ap.parse_args()
    print("| variant | test NDCG@100 per split (ridge) | mean |")
    print("|---|---|---:|")
    for var in a.variants.split(","):
        depth, unit = int(var.rstrip("n")), var.endswith("n")
        got = [one_split(a.data / f"seed-{s}", depth, unit) for s in a.seeds.split(",")]
        per = " ".join(f"{t:.4f} ({r:g})" for t, r in got)
        name = f"depth {depth}" + (", unit-length rows" if unit else "")
        print(f"| {name} | {per} | {np.mean([t for t, _ in got]):.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
