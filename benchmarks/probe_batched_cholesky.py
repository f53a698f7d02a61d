"""Probe: what one batch of the sparse solver's neighbourhood systems costs, by method.

LAPACK's batched potrf + potrs (PyTorch), `linalg.spd_solve_batch` (factored by halves on
batched products) and `gather.solve_systems` (gathered, factored and solved in one compiled
pass per system), on random positive definite systems drawn from one dense block as the solver
draws them; seconds per system and GFLOP/s of the factorisation (k^3 / 3 a system).

    OMP_NUM_THREADS=2 python benchmarks/probe_batched_cholesky.py
"""

from __future__ import annotations

import time

import numpy as np
import torch

from vaecf.bench import hardware
from vaecf.models import gather, linalg


def best(fn, rounds: int = 3) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def row(k: int, j: int, rng) -> str:
    x = rng.standard_normal((2 * k, 2 * k)).astype(np.float32)
    full = x @ x.T / (2 * k)  # one dense block; each system k of its items
    p = np.stack([rng.choice(2 * k, size=k, replace=False) for _ in range(j)])
    lam = np.ones(2 * k, dtype=np.float32)
    at = rng.integers(0, 2 * k, size=j)
    a, rhs = gather.systems(full, p, lam, at)
    at_t, rhs_t = torch.from_numpy(a), torch.from_numpy(rhs)

    def lapack():
        chol = torch.linalg.cholesky(at_t)
        return torch.cholesky_solve(rhs_t[:, :, None], chol)

    copy = best(lambda: at_t.clone())
    t_lapack = best(lapack)
    t_halves = best(lambda: linalg.spd_solve_batch(at_t.clone(), rhs_t)) - copy
    t_compiled = best(lambda: gather.solve_systems(full, p, lam, at))
    return (f"| {k} | {j} | {1e3 * t_lapack / j:.3f} | {1e3 * t_halves / j:.3f} | "
            f"{1e3 * t_compiled / j:.3f} | {j * k**3 / 3 / t_lapack / 1e9:.1f} | "
            f"{t_lapack / t_halves:.2f} | {t_lapack / t_compiled:.2f} |")  # fmt: skip


def main() -> int:
    rng = np.random.default_rng(0)
    print(hardware.machine())
    print("| k | systems | LAPACK ms/system | halves ms/system | compiled ms/system | "
          "LAPACK GFLOP/s | halves x | compiled x |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k, j in ((256, 512), (1024, 32)):
        print(row(k, j, rng))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
