"""Probe: where a replay of batch 500's graphed Mult-VAE step goes, part by part.

    python benchmarks/probe_b500_parts.py [--device cuda] [--precision bf16] [--kernel dense]
                                          [--replays 300]

At the paper's batch a graphed step on an H200 took 1.13 ms (benchmarks/README.md, "Training
speed: GPU"), where its arithmetic and its unavoidable memory traffic come to ~0.3-0.4 ms. A
replay cannot be profiled kernel by kernel, so this captures graphs of growing prefixes of the
step, ML-20M shape (136,677 x 20,108, 10M interactions), and times each replay with CUDA events:
the padded batch alone; + the forward; + the backward; + fused Adam (the whole step, as
training captures it); the same with foreach Adam; fused and foreach Adam alone on a fixed
gradient; and the eager kernels the trainer launches beside each replay (the rows' copy, beta,
the loss totals). The differences between rows are each part's share of a replay. On a CPU it
times the same parts eagerly (a smoke run of the probe itself, not a figure).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from vaecf import models
from vaecf import precision as prec
from vaecf.bench import speed as bench
from vaecf.bench.hardware import device_name
from vaecf.data.matrix import CSR
from vaecf.training import graphs
from vaecf.training.gradient import make_optimizer


def timed(fn, device: torch.device, replays: int) -> float:
    """Median ms of `fn` over `replays` calls (CUDA: one event pair around each call)."""
    for _ in range(5):
        fn()
    out = []
    for _ in range(replays):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def as_graph(fn, device: torch.device):
    """`fn` captured as a CUDA graph (PyTorch's recipe: warm-up on a side stream), returned as
    its replay; on a CPU `fn` itself."""
    if device.type != "cuda":
        return fn
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--kernel", default="dense", help="the first layer's (models/first_layer.py)")
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--users", type=int, default=136_677)
    ap.add_argument("--items", type=int, default=20_108)
    ap.add_argument("--nnz", type=int, default=10**7)
    a = ap.parse_args()
    dev, batch_size = torch.device(a.device), 500
    data = bench.synthetic_csr(a.users, a.items, a.nnz)
    csr = CSR.from_scipy(data, dev)
    capacity = graphs.graph_capacity(np.diff(data.indptr), batch_size)
    torch.manual_seed(0)
    net = models.build("multvae", a.items).to(dev).train()
    net.first_layer = a.kernel
    rows = torch.randint(0, csr.n_rows, (batch_size,), device=dev)
    beta = torch.full((), 0.2, device=dev)

    def loss():
        batch = csr.padded_batch(rows, capacity)
        with prec.autocast(dev, a.precision):
            return net.loss(batch, beta, batch_size)[0]

    def backward():
        net.zero_grad(set_to_none=True)
        loss().backward()

    def optimizer(foreach: bool):
        if foreach:
            opt = torch.optim.Adam(
                net.parameters(), lr=1e-3, foreach=True, capturable=dev.type == "cuda"
            )
        else:
            opt = make_optimizer(net, 1e-3, dev)
            for g in opt.param_groups:
                g["capturable"] = dev.type == "cuda"
        return opt

    fused, foreach = optimizer(False), optimizer(True)

    def step(opt):
        backward()
        opt.step()

    totals = torch.zeros(4, dtype=torch.float64, device=dev)
    parts = {"nll_sum": beta * 1, "kl_sum": beta * 2, "kl_term_sum": beta * 3}
    source = rows.clone()

    def beside():  # what gradient.py launches around each replay
        rows.copy_(source)
        beta.fill_(0.2)
        for i, k in enumerate(parts):
            totals[i] += parts[k]

    cases = [
        ("padded batch", lambda: csr.padded_batch(rows, capacity)),
        ("+ forward", loss),
        ("+ backward", backward),
        ("+ fused Adam: the step as trained", lambda: step(fused)),
        ("the step with foreach Adam", lambda: step(foreach)),
    ]
    timings = [(label, timed(as_graph(fn, dev), dev, a.replays)) for label, fn in cases]
    backward()  # a fixed gradient for the optimizers alone
    for label, opt in (("fused Adam alone", fused), ("foreach Adam alone", foreach)):
        timings.append((label, timed(as_graph(opt.step, dev), dev, a.replays)))
    timings.append(("eager kernels beside a replay", timed(beside, dev, a.replays)))
    what = "graph replay" if dev.type == "cuda" else "eager call (CPU: a smoke run)"
    print(f"Mult-VAE, batch {batch_size}, {a.items:,} items, {a.precision}, first layer "
          f"{a.kernel}, {device_name(dev)}, torch {torch.__version__}; median ms a {what}"
          f" over {a.replays}")  # fmt: skip
    for label, ms in timings:
        print(f"  {label:40s} {ms:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
