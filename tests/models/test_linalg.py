"""The models' dense linear algebra on its guarded path (vaecf.models.linalg): both LAPACK paths
give the inverse, in place; the size rule that keeps scipy's OpenBLAS away from its threaded
SYRK's buffer overrun; a dense solve past that size; and no native call anywhere else."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch

from vaecf import memory
from vaecf.errors import RunError
from vaecf.models import linalg
from vaecf.models.linear import linear_weights

SRC = Path(__file__).resolve().parents[2] / "src" / "vaecf"
GUARDED = SRC / "models" / "linalg.py"
# a factorisation, inverse, solve or BLAS call, in code (strings and comments are dropped)
NATIVE = re.compile(
    r"scipy\.linalg|from scipy import linalg|\blapack\b|\bblas\b|\b(np|numpy)\.linalg"
    r"|torch\.linalg\.(?!vector_norm\b|matrix_norm\b|norm\b)|torch\.cholesky|\.cholesky\w*\("
    r"|torch\.(inverse|linalg_)|\b[sd](potr[fi]|syrk|gemm|trsm)\b"
)


def code_of(path: Path) -> str:
    """The module's source with its strings and comments blanked out."""
    lines = path.read_text().splitlines(keepends=True)
    for t in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if t.type in (tokenize.STRING, tokenize.COMMENT):
            (r0, c0), (r1, c1) = t.start, t.end
            for r in range(r0, r1 + 1):
                a, b = (c0 if r == r0 else 0), (c1 if r == r1 else len(lines[r - 1]))
                lines[r - 1] = lines[r - 1][:a] + " " * (b - a) + lines[r - 1][b:]
    return "".join(lines)


def test_every_native_call_goes_through_the_guarded_module():
    assert NATIVE.search(code_of(GUARDED)), "the pattern finds the guarded module's own calls"
    found = {
        str(p.relative_to(SRC)): sorted({m.group(0) for m in NATIVE.finditer(code_of(p))})
        for p in SRC.rglob("*.py")
        if p != GUARDED
    }
    assert {k: v for k, v in found.items() if v} == {}


def spd(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    x = (torch.rand(2 * n, n, generator=torch.Generator().manual_seed(seed)) < 0.1).to(dtype)
    g = x.T @ x
    g.diagonal().add_(5.0)
    return g


@pytest.mark.parametrize("path", ["scipy", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_both_paths_invert_in_place(path, dtype):
    a = spd(300, dtype)
    want = torch.linalg.inv(a.double())
    work = a.clone()
    got = linalg.spd_inverse(work, path)
    assert got.data_ptr() == work.data_ptr(), "the inverse is in the matrix's own memory"
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(got.double(), want, atol=tol * float(want.abs().max()))
    assert torch.equal(got, got.T), "both triangles hold the inverse"


@pytest.mark.parametrize("path", ["scipy", "torch"])
def test_both_paths_refuse_what_is_not_positive_definite(path):
    a = spd(50, torch.float64)
    a[7, 7] = -1.0
    with pytest.raises(linalg.NotPositiveDefinite):
        linalg.spd_inverse(a, path)


def test_a_linear_fit_that_is_not_positive_definite_says_what_to_do():
    g = torch.zeros(20, 20)
    with pytest.raises(RunError, match="use a larger --l2"):
        linear_weights(g, 0.0)


@pytest.mark.parametrize("k", [1, 7, 32, 33, 100, 256])
def test_batched_solves_match_a_direct_solve(k, monkeypatch):
    monkeypatch.setattr(linalg, "SYSTEMS_BYTES", 3 * k * k * 8)  # groups of 4: 10 = 4 + 4 + 2
    g = torch.Generator().manual_seed(k)
    m = torch.randn(10, k, k + 3, generator=g, dtype=torch.float64)
    a = m @ m.mT + 0.1 * torch.eye(k, dtype=torch.float64)
    rhs = torch.randn(10, k, generator=g, dtype=torch.float64)
    # the references one system at a time (PyTorch's batched LU runs MKL's threaded getrf
    # inside its own parallel loop, which hung once in the suite)
    want = np.stack([np.linalg.solve(a[j].numpy(), rhs[j].numpy()) for j in range(10)])
    lower = np.stack([np.linalg.cholesky(a[j].numpy()) for j in range(10)])
    factors = a.clone()
    got = linalg.spd_solve_batch(factors, rhs)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(factors.numpy(), lower, rtol=1e-9, atol=1e-9)


def test_a_batch_with_one_system_not_positive_definite_is_refused():
    a = torch.eye(100).repeat(3, 1, 1)
    a[1, 70, 70] = -1.0  # found in the trailing half's factorisation
    with pytest.raises(linalg.NotPositiveDefinite):
        linalg.spd_solve_batch(a, torch.ones(3, 100))


def test_openblas_takes_only_the_sizes_its_threaded_syrk_holds():
    cpu = torch.device("cpu")
    assert linalg.solver(22_000, torch.float32, cpu) == ("scipy" if linalg.X86 else "torch")
    assert linalg.solver(22_001, torch.float32, cpu) == "torch"
    assert linalg.solver(11_000, torch.float64, cpu) == ("scipy" if linalg.X86 else "torch")
    assert linalg.solver(11_001, torch.float64, cpu) == "torch"
    # the sizes that crashed OpenBLAS 0.3.30 on two threads (SkylakeX kernels) take torch
    assert linalg.solver(26_500, torch.float32, cpu) == "torch"
    assert linalg.solver(16_000, torch.float64, cpu) == "torch"
    assert linalg.solver(3_000, torch.float32, torch.device("meta")) == "torch"


def test_add_gram_past_the_bound_is_the_whole_product():
    n = 11_001  # float64: past OpenBLAS's bound, so a product instead of syrk
    k = torch.rand(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    gram = torch.zeros(n, n, dtype=torch.float64)
    linalg.add_gram_(gram, k)
    rows = [0, 5_000, n - 1]
    assert torch.allclose(gram[rows], k[:, rows].T @ k)
    small = torch.zeros(40, 40, dtype=torch.float64)
    linalg.add_gram_(small, k[:, :40])  # syrk: the lower triangle alone
    assert torch.allclose(small.tril(), (k[:, :40].T @ k[:, :40]).tril())


@pytest.mark.parametrize("rows", [3, 60])
def test_add_outer_is_the_whole_product(rows):
    """By blocks below the diagonal and their mirror (60 rows for 203 items), or one product."""
    gen = torch.Generator().manual_seed(rows)
    a = torch.rand(203, 203, dtype=torch.float64, generator=gen)
    p = a + a.T
    v = torch.rand(rows, 203, dtype=torch.float64, generator=gen)
    want = p - 0.5 * v.T @ v
    linalg.add_outer_(p, v, -0.5)
    torch.testing.assert_close(p, want, rtol=1e-12, atol=1e-12)


def test_a_dense_solve_past_openblas_bound():
    """float64 just past the bound (11,001 items; scipy's dpotrf on two threads died with
    SIGSEGV from 16,000, OpenBLAS 0.3.30, SkylakeX kernels): PyTorch's path, on two threads,
    must invert it (n I + J: the inverse is (I - J / 2n) / n). The routing of larger sizes is
    checked above; at 16,000 this test took 96 s of the suite under CI, at 11,001 a third."""
    n, dtype = 11_001, torch.float64
    need = 2 * n * n * dtype.itemsize + 2**30
    free = memory.free_memory(torch.device("cpu")).bytes
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB free, {free / 2**30:.1f} GiB are")
    assert linalg.solver(n, dtype, torch.device("cpu")) == "torch"
    a = torch.ones(n, n, dtype=dtype)
    a.diagonal().add_(n)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # ~12 s on two cores, twice on one
    try:
        p = linalg.spd_inverse(a)
    finally:
        torch.set_num_threads(threads)
    cols = [0, 7_777, n - 1]
    want = torch.full((n, 3), -1.0 / (2 * n * n), dtype=dtype)
    want[cols, range(3)] += 1.0 / n
    assert torch.allclose(p[:, cols], want, rtol=0, atol=1e-12 / n)
