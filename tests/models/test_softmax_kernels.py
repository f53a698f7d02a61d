"""The fused layer's Triton kernels against PyTorch's path, on a CPU through Triton's interpreter
(skipped where Triton is not installed, as on CPU builds of PyTorch; tests/training/test_cuda.py
checks them on a GPU)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECK = r"""
import torch
from vaecf.data.matrix import CSR
from vaecf.bench.speed import synthetic_csr
from vaecf.models import fused, softmax_kernels

assert softmax_kernels.available(torch.device("cpu"))
m = synthetic_csr(300, 333, 4000, seed=3)  # 333 items: rows padded and masked
batch = CSR.from_scipy(m, "cpu").batch(torch.arange(0, 300, 4))
for autocast in (False, True):
    got = []
    for use in (True, False):
        fused.USE_KERNELS = use
        torch.manual_seed(1)
        h = torch.randn(75, 16, requires_grad=True)
        w, b = torch.randn(333, 16, requires_grad=True), torch.randn(333, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = fused.linear_multinomial_nll(h, w, b, batch, multiple=64)
        loss.backward()
        got.append([loss.detach(), h.grad, w.grad, b.grad])
    tol = 2e-2 if autocast else 1e-5
    for a, r in zip(*got):
        s = r.abs().max()
        torch.testing.assert_close(a / s, r / s, rtol=tol, atol=tol)
    # the log-sum-exp kernel alone against torch's, -inf padding included
    x = torch.randn(5, 4099) * 30
    x[:, 4000:] = float("-inf")
    torch.testing.assert_close(softmax_kernels.row_logsumexp(x), torch.logsumexp(x, 1))
# a GPU where the kernels cannot build or run keeps PyTorch's kernels, with a warning (here: no
# CUDA at all, so the first trial fails); the answer is kept
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert not softmax_kernels.available(torch.device("cuda:0"))
    assert not softmax_kernels.available(torch.device("cuda:0"))
assert len(caught) == 1 and "PyTorch's kernels are used" in str(caught[0].message)
print("ok")
"""


def test_the_triton_kernels_equal_pytorchs_softmax_in_the_interpreter():
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root / "src"), *sys.path])  # where this process found Triton
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    p = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
