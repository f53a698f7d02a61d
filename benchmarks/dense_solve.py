"""The dense SPD inverse EASE/EDLAE solve, by each CPU path, each in its own process.

    python benchmarks/dense_solve.py [--items 32602] [--dtype float32]
                                     [--paths scipy-2,scipy-1,torch] [--coretype SkylakeX]

One dense (n, n) symmetric positive definite matrix, n I + J (J: all ones; its inverse has no
entries small enough to slow the arithmetic, where a banded matrix's decay to subnormal floats
made OpenBLAS's inverse 17x slower at 3,000 items), inverted
in place by `vaecf.models.linalg.spd_inverse` with its path forced: scipy's LAPACK (OpenBLAS) on
2 threads, on 1 thread, or PyTorch's (MKL on x86-64). A path that crashes the process is a row
too ("SIGSEGV after 0.3 s": OpenBLAS's threaded SYRK writes past its buffer beyond a size; see
vaecf.models.linalg), so the table shows where each path is safe. Columns: seconds for the
factorisation and inverse, the process's peak RSS, max |A P - I| over three of P's columns, and
the path vaecf itself takes at this size. `--coretype` sets OPENBLAS_CORETYPE for the children
(the kernels OpenBLAS picks; its buffer need scales with their GEMM_Q).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import torch

from vaecf.bench.hardware import machine
from vaecf.models import linalg

CHILD = r"""
import json, resource, sys, time, torch
from vaecf.models.linalg import spd_inverse
n, dtype, path = int(sys.argv[1]), getattr(torch, sys.argv[2]), sys.argv[3]
a = torch.ones(n, n, dtype=dtype)  # n I + J: dense, and its inverse is (I - J / 2n) / n
a.diagonal().add_(n)
print("built", flush=True)
t = time.perf_counter()
p = spd_inverse(a, path)
seconds = time.perf_counter() - t
cols = [0, n // 2, n - 1]
c = p[:, cols].double()
ap = n * c + c.sum(0)  # (n I + J) c
ap[cols, range(3)] -= 1.0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"seconds": seconds, "rss_gib": rss, "error": float(ap.abs().max())}))
"""


def run(n: int, dtype: str, path: str, coretype: str | None) -> dict:
    solver, _, threads = path.partition("-")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads or "2", OMP_NUM_THREADS="2")
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    args = [sys.executable, "-c", CHILD, str(n), dtype, solver]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()  # "built": the clock starts after the matrix is made
    t0 = time.perf_counter()
    out = proc.stdout.read()
    proc.wait()
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return {"crash": f"{name} after {time.perf_counter() - t0:.1f} s"}
    if proc.returncode:
        return {"crash": f"exit {proc.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=32_602)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--paths", default="scipy-2,scipy-1,torch", help="scipy-THREADS or torch")
    ap.add_argument("--coretype", help="OPENBLAS_CORETYPE for the children")
    a = ap.parse_args()
    vaecf_path = "scipy" if linalg.openblas_safe(a.items, getattr(torch, a.dtype)) else "torch"
    print(f"{a.items:,} items, {a.dtype}; {machine()}; OPENBLAS_CORETYPE {a.coretype or 'auto'}")
    print(f"vaecf's path at this size: {vaecf_path}\n")
    print("| path | seconds | peak RSS GiB | max abs(A P - I) |\n|---|---:|---:|---:|")
    for path in a.paths.split(","):
        r = run(a.items, a.dtype, path, a.coretype)
        name = path.replace("-", ", ") + (" threads" if "-" in path else "")
        if "crash" in r:
            print(f"| {name} | {r['crash']} | | |", flush=True)
        else:
            print(
                f"| {name} | {r['seconds']:.1f} | {r['rss_gib']:.2f} | {r['error']:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
