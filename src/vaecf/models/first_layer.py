"""The autoencoders' first layer, a sparse batch of histories times a (n_items, d) weight, and the
choice of its kernel by measurement.

Four kernels compute the same (B, d) product, row u = sum over u's non-zeros i of v_i W[i]:

- "bag": `embedding_bag` with per-sample weights (the CPU's kernel, and scoring's everywhere;
  on a CPU its weight gradient is a second embedding_bag over the transposed batch, BagProduct);
- "gather": `index_select` of the non-zeros' rows, then `index_add_` into the batch's rows (a
  (nnz, d) temporary; its atomics serialise on popular items at large batches);
- "csr": the batch as a CSR matrix, `torch.sparse.mm` (cuSPARSE on a GPU), computed in the
  weight's dtype;
- "dense": the batch scattered into a dense (B, n_items) array in the compute dtype, then one
  dense product (tensor cores under autocast; its backward, X^T @ grad, likewise); on a GPU
  its rows padded to 16-byte multiples (`dense_width`).

Which is fastest depends on the device, the batch and the catalogue (one NVIDIA H200 at batch
24,576 x 20,108 items, forward + backward: gather 20.7 ms, embedding_bag 5.6, CSR 1.6-1.9;
benchmarks/README.md), so on a GPU `choose` times each on a real batch of the run and keeps the
fastest whose answer agrees with embedding_bag's; the trainer records the choice and the times
in results.json. A CPU keeps "bag" without measuring (the others are slower there and a
measured choice would make runs depend on the machine's load).
"""

from __future__ import annotations

import time
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F

from vaecf import precision as prec
from vaecf.data.matrix import SparseBatch
from vaecf.models.fused import logits_width, padded

KERNELS = ("bag", "gather", "csr", "dense")
DENSE_LIMIT_BYTES = 4 << 30  # "dense" is not tried where its (B, n_items) array is larger
# What an eager step costs over its CUDA graph (launching ~150 kernels from Python): H200, batch
# 500, ML-20M shape, 4,600 steps in 21.7 s eagerly against 13.2 s as graphs (benchmarks/README.md)
EAGER_STEP_MS = 2.0
warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype products run in here: autocast's where it is on, else the weight's."""
    kind = weight.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def product(batch: SparseBatch, weight: torch.Tensor, v: torch.Tensor, kernel: str = "bag"):
    """(B, d): the sparse batch (values `v`, (nnz,)) times `weight` (n_items, d), by `kernel`."""
    if kernel == "bag":
        v = v.to(weight.dtype)
        if weight.device.type == "cpu" and torch.is_grad_enabled() and not v.requires_grad:
            return BagProduct.apply(weight, batch.indices, batch.offsets, v, batch.row_ids)
        return F.embedding_bag(
            batch.indices, weight, batch.offsets, mode="sum", per_sample_weights=v
        )
    if kernel == "gather":
        parts = weight.index_select(0, batch.indices) * v.to(weight.dtype)[:, None]
        out = torch.zeros(batch.batch_size, weight.shape[1], dtype=parts.dtype, device=parts.device)
        return out.index_add_(0, batch.row_ids, parts)
    n = weight.shape[0]
    if kernel == "csr":
        total = batch.offsets.new_full((1,), batch.indices.numel())
        crow = torch.cat([batch.offsets, total])
        with torch.autocast(weight.device.type, enabled=False):
            x = torch.sparse_csr_tensor(
                crow,
                batch.indices,
                v.to(weight.dtype),
                (batch.batch_size, n),
                check_invariants=False,
            )
            return torch.sparse.mm(x, weight)
    if kernel == "dense":
        dt = compute_dtype(weight)
        return dense_product(batch, weight, v, dense_width(n, dt, weight.device))
    raise ValueError(f"unknown first-layer kernel {kernel!r}; one of {', '.join(KERNELS)}")


class BagProduct(torch.autograd.Function):
    """The CPU's "bag" in training: embedding_bag forward; the weight's gradient (the batch
    transposed times the output's gradient) as a second embedding_bag over the gradient's rows,
    one bag per item (its non-zeros in user order). Each gradient row is written once, where
    embedding_bag's own backward zero-fills the (n_items, d) array, sorts and scatters into it:
    a training step -3 to -6% on a CPU (benchmarks/README.md, "Training speed: CPU"). The same
    sums, in user order."""

    @staticmethod
    def forward(ctx, weight, indices, offsets, v, row_ids):
        ctx.save_for_backward(indices, v, row_ids)
        ctx.n_items, ctx.dtype = weight.shape[0], weight.dtype
        return F.embedding_bag(indices, weight, offsets, mode="sum", per_sample_weights=v)

    @staticmethod
    def backward(ctx, grad):
        indices, v, row_ids = ctx.saved_tensors
        order = torch.argsort(indices, stable=True)
        counts = torch.bincount(indices, minlength=ctx.n_items)
        starts = counts.cumsum(0) - counts
        v = v[order].to(grad.dtype)
        weight_grad = F.embedding_bag(
            row_ids[order], grad, starts, mode="sum", per_sample_weights=v
        )
        return weight_grad.to(ctx.dtype), None, None, None, None


def dense_product(batch: SparseBatch, weight: torch.Tensor, v: torch.Tensor, width: int):
    """The "dense" kernel: the batch scattered into a (B, width) array in the compute dtype
    (width >= n_items: zero columns beyond), times the weight with as many rows (zero rows
    beyond)."""
    dt = compute_dtype(weight)
    x = torch.zeros(batch.batch_size * width, dtype=dt, device=weight.device)
    x.index_add_(0, batch.row_ids * width + batch.indices, v.to(dt))  # positions are unique
    return x.view(batch.batch_size, width) @ padded(weight, dt, width)


def dense_width(n_items: int, dtype: torch.dtype, device: torch.device) -> int:
    """The row length of "dense"'s (B, n_items) array: on a GPU, where a row of `dtype` is not a
    multiple of 16 bytes (20,108 items in bf16: 40,216), n_items padded as the fused output
    layer pads its logits (models/fused.py: cuBLAS's Hopper kernels need aligned rows), with
    zero weight rows beyond n_items; else n_items."""
    if device.type == "cpu" or n_items * torch.finfo(dtype).bits % 128 == 0:
        return n_items
    return logits_width(n_items, device)


def candidates(batch: SparseBatch, weight: torch.Tensor) -> list[str]:
    """The kernels worth timing for this batch and weight."""
    if weight.device.type == "cpu":
        return ["bag"]
    dense_bytes = batch.batch_size * weight.shape[0] * torch.finfo(compute_dtype(weight)).bits // 8
    return [k for k in KERNELS if k != "dense" or dense_bytes <= DENSE_LIMIT_BYTES]


def time_kernel(batch, weight, v, kernel: str, graphed: bool = False, reps: int = 5):
    """(median ms of forward + backward to the weight, the forward's output), after 2 warm-ups;
    `graphed`: both captured as one CUDA graph and replayed (as a graphed training step runs
    them; a kernel that cannot be captured raises)."""
    w = weight.detach().requires_grad_()
    probe = torch.linspace(-1, 1, w.shape[1], device=w.device)

    def run() -> torch.Tensor:
        out = product(batch, w, v, kernel)
        (out.float() @ probe).sum().backward()
        return out

    call = run
    if graphed:
        side = torch.cuda.Stream(w.device)
        side.wait_stream(torch.cuda.current_stream(w.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                run()
                w.grad = None
        torch.cuda.current_stream(w.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()

        def call() -> torch.Tensor:
            graph.replay()
            return out

    times = []
    for i in range(2 + reps):
        prec.synchronize(w.device)
        t0 = time.perf_counter()
        out = call()
        prec.synchronize(w.device)
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
        if not graphed:
            w.grad = None
    times.sort()
    return times[len(times) // 2], out.detach().to(torch.float32, copy=True)


def choose(batch, weight, v, kernels=None, graphed: bool = False) -> tuple[str, dict]:
    """(the fastest of `kernels` (default: `candidates`) whose output agrees with the first's,
    {kernel: ms or why not}), timed on this batch in the caller's autocast and matmul settings
    (`graphed`: as CUDA graphs). A CPU by default: ("bag", {})."""
    found = kernels or candidates(batch, weight)
    if found == ["bag"]:
        return "bag", {}
    times: dict[str, float | str] = {}
    reference = None
    for kernel in found:
        try:
            ms, out = time_kernel(batch, weight, v, kernel, graphed)
        except (RuntimeError, NotImplementedError) as e:  # a kernel this build lacks
            times[kernel] = f"failed: {type(e).__name__}: {str(e)[:80]}"
            continue
        if reference is None:
            reference = out
        scale = reference.abs().max().clamp_min(1e-6)
        if (out - reference).abs().max() > 2e-2 * scale:  # bf16's error is ~1e-3 of the scale
            times[kernel] = "failed: disagrees with embedding_bag"
            continue
        times[kernel] = round(ms, 3)
    timed = {k: t for k, t in times.items() if isinstance(t, float)}
    return min(timed, key=timed.get), times


class Choice(NamedTuple):
    kernel: str | None  # None: the model has no sparse first layer
    ms: dict  # {kernel: forward + backward ms, or why it was not used}
    graphs: bool = True  # False: this kernel runs only eagerly ("csr")


def choose_for(model, csr, batch_size: int, precision: str, setting="auto", graphed=False):
    """Set `model`'s training kernel (`Model.use_first_layer`) from `setting` and return the
    Choice. "auto": the fastest measured by `choose` on the first `batch_size` rows of `csr`
    (the training matrix) on the model's device in `precision`, with the RNG put back (a run is
    the same whether or not it measured); a CPU keeps "bag". Where the step would be a CUDA
    graph (`graphed`), the graph-capturable kernels are timed as graphs, and "csr" (which
    cannot be captured) eagerly: it is kept, with graphs off, where it beats the best graphed
    kernel by more than an eager step's launch cost (EAGER_STEP_MS)."""
    found = model.first_layer_input()
    if found is None:
        return Choice(None, {})
    device = model.device
    if setting != "auto" or device.type == "cpu":
        kernel = "bag" if setting == "auto" else setting
        model.use_first_layer(kernel)
        return Choice(kernel, {}, kernel != "csr")
    weight, values = found
    rows = torch.arange(min(batch_size, csr.n_rows), device=csr.device)
    batch = csr.batch(rows).to(device)
    kernels = candidates(batch, weight)
    was_training = model.training
    model.train()
    with (
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        prec.matmul_scope(device, precision),
        prec.autocast(device, precision),
    ):
        v = values(batch).detach()
        if not graphed:
            kernel, times = choose(batch, weight, v, kernels)
            choice = Choice(kernel, times, kernel != "csr")
        else:
            kernel, times = choose(batch, weight, v, [k for k in kernels if k != "csr"], True)
            choice = Choice(kernel, times)
            if "csr" in kernels:
                eager = choose(batch, weight, v, ["bag", "csr"])[1].get("csr")
                times["csr (eager)"] = eager
                if isinstance(eager, float) and eager + EAGER_STEP_MS < times[kernel]:
                    choice = Choice("csr", times, False)
    model.train(was_training)
    model.use_first_layer(choice.kernel)
    return choice
