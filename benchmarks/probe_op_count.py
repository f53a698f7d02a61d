"""Probe: how many operators (kernels, on a GPU) one training step dispatches.

    python benchmarks/probe_op_count.py

Mult-VAE's step, and RecVAE's epoch of four phase steps (3 encoder, 1 decoder) on the meta
device, counted by region for RecVAE (the loss's forward, the encoder, the NLL, the backward,
Adam, the rest: the padded batch).

On the CPU (fp32 and bf16, eager, as `vaecf bench train` runs it) and on PyTorch's "meta"
device, which takes the GPU's code path in models/fused.py (addmm with the bias, the
whole-row softmax, index_add) without a GPU: fp32 only (autocast has no meta device), the
dense first layer (what a GPU picks at batch 500) and foreach Adam (a GPU runs fused Adam,
1-2 kernels). Views, detaches, allocations and profiler markers are not counted: they launch
nothing.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vaecf.models.first_layer as first_layer
import vaecf.models.fused as fused
from vaecf import bench, models
from vaecf.data.matrix import CSR

NO_KERNEL = {
    "detach", "t", "view", "slice", "expand", "unsqueeze", "alias", "as_strided", "permute",
    "transpose", "select", "lift_fresh", "_local_scalar_dense", "_record_function_enter_new",
    "_record_function_exit", "new_empty", "empty", "empty_like", "empty_strided",
}  # fmt: skip


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.by_region: Counter = Counter()
        self.region = ["step"]
        self.on = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.on and name not in NO_KERNEL:
            self.ops[name] += 1
            self.by_region[self.region[-1]] += 1
        return func(*args, **(kwargs or {}))


def cpu_step(precision: str) -> Counter:
    data = bench.synthetic_csr(3000, 2000, 60000)
    count = Count()
    steps = [0]

    def on_step():
        steps[0] += 1
        count.on = steps[0] == 2  # the third step alone

    with count:
        bench.bench_train(precision, 500, steps=2, warmup=1, data=data, progress=False,
                          device="cpu", on_step=on_step)  # fmt: skip
    return count.ops


def meta_setup() -> None:
    fused._compute_dtype = lambda t: t.dtype  # no autocast on meta
    first_layer.compute_dtype = lambda w: w.dtype
    real_autocast = torch.autocast

    def autocast(device_type, *a, **k):
        return (
            contextlib.nullcontext()
            if device_type == "meta"
            else real_autocast(device_type, *a, **k)
        )

    torch.autocast = autocast


def meta_step() -> Counter:
    dev = torch.device("meta")
    csr = CSR.from_scipy(bench.synthetic_csr(3000, 2000, 60000), dev)
    net = models.build("multvae", 2000).to(dev).train()
    net.first_layer = "dense"
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, foreach=True)
    rows = torch.arange(500, device=dev)
    count = Count()
    with count:
        for i in range(2):
            count.on = i == 1
            loss, _ = net.loss(csr.padded_batch(rows, 20000), 0.2, 500)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return count.ops


def recvae_regions() -> Counter:
    """RecVAE's epoch of phase steps on meta, operators by region."""
    dev = torch.device("meta")
    csr = CSR.from_scipy(bench.synthetic_csr(3000, 2000, 60000), dev)
    net = models.build("recvae", 2000).to(dev).train()
    net.encoder.first_layer = net.prior_encoder.first_layer = "dense"
    region = ["rest"]

    def label(obj, name, what):
        f = getattr(obj, name)

        def inner(*a, **k):
            region.append(what)
            try:
                return f(*a, **k)
            finally:
                region.pop()

        setattr(obj, name, inner)

    label(net.encoder, "forward", "encoder")
    label(net, "nll", "nll")
    opts = {k: torch.optim.Adam(v, lr=1e-3, foreach=True) for k, v in net.param_groups().items()}
    rows = torch.arange(500, device=dev)
    count = Count()
    count.region = region
    with count:
        for i in range(2):
            for phase in net.phases():
                net.begin_phase(phase)
                for _ in range(phase.passes):
                    count.on = i == 1
                    batch = csr.padded_batch(rows, 20000)
                    region.append("loss")
                    loss, _ = net.loss(batch, 0.2, 500, phase)
                    region[-1] = "backward"
                    for o in opts.values():
                        o.zero_grad(set_to_none=True)
                    loss.backward()
                    region[-1] = "adam"
                    for g in phase.groups:
                        opts[g].step()
                    region.pop()
    return count.by_region


def main() -> int:
    for label, ops in (("cpu fp32", cpu_step("fp32")), ("cpu bf16", cpu_step("bf16"))):
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
        print(f"{label:26s} {sum(ops.values()):4d} operators a step; most: {top}")
    meta_setup()
    ops = meta_step()
    top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
    print(f"{'meta (the GPU path) fp32':26s} {sum(ops.values()):4d} operators a step; most: {top}")
    regions = recvae_regions()
    print(f"RecVAE, meta, an epoch's 4 phase steps: {sum(regions.values())} operators; by region:",
          ", ".join(f"{k} {v}" for k, v in regions.most_common()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
