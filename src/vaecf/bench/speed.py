"""Benchmarks as commands: training throughput and inference latency on any shape or run.

Training: users/s over whole steps (batch slicing, forward, backward, optimizer), the achieved
GFLOP/s (dense layers forward + two backward products, sparse first layer forward + weight
gradient) and a breakdown of the step. Inference: latency percentiles and throughput of a
fold-in with the seen-item mask and top-100, for batch 1 and large batches.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from vaecf import models
from vaecf import precision as prec
from vaecf.bench import roofline
from vaecf.data.matrix import CSR
from vaecf.errors import ConfigError
from vaecf.models import first_layer
from vaecf.models.multvae import MultAE
from vaecf.models.serving import serving_copy
from vaecf.runtime import tune_cpu_allocator
from vaecf.training import graphs

ML20M = {"users": 136_677, "items": 20_108, "nnz": 10_000_000}  # the paper's ML-20M training set


def add_shape_arguments(ap) -> None:
    """--users, --items and --nnz of a benchmark's synthetic matrix (default: ML-20M's)."""
    for name in ("users", "items", "nnz"):
        ap.add_argument(f"--{name}", type=int, default=ML20M[name])


def synthetic_csr(users: int, items: int, nnz: int, seed: int = 0) -> sp.csr_matrix:
    """A binary matrix of the given shape with power-law items and heavy-tailed users."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, items + 1) ** 0.9
    pop = rng.permutation(pop / pop.sum())
    act = rng.lognormal(0.0, 1.0, users)
    per_user = np.maximum(1, np.round(act / act.sum() * nnz)).astype(np.int64)
    cols = rng.choice(items, size=int(per_user.sum()), p=pop)
    rows = np.repeat(np.arange(users), per_user)
    m = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(users, items))
    m.sum_duplicates()
    m.data[:] = 1.0
    return m


def step_flops(model, batch_size: int, nnz: int) -> float:
    """FLOPs of one Mult-VAE/DAE training step: dense layers x3 (forward, input and weight
    gradients), the sparse first layer x2 (forward and weight gradient) over the batch's
    non-zeros. NaN for other models."""
    if not isinstance(model, MultAE):
        return float("nan")
    dense = sum(m.weight.numel() for m in [*model.encoder, *model.decoder])
    return 2.0 * (3 * dense * batch_size + 2 * model.in_weight.shape[1] * nnz)


def default_precisions(device: str = "auto") -> list[str]:
    """fp32, and bf16 where the device computes it natively (emulated bf16 is far slower)."""
    dev = prec.resolve_device(device)
    return ["fp32", "bf16"] if prec.native_bf16(dev) else ["fp32"]


@dataclasses.dataclass
class TrainBench:
    precision: str
    batch_size: int
    users_per_s: float
    step_ms: float
    gflops: float
    breakdown_ms: dict
    first_layer: str = "bag"  # the first layer's kernel (models/first_layer.py)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def bench_train(
    precision: str = "bf16",
    batch_size: int = 500,
    users: int = ML20M["users"],
    items: int = ML20M["items"],
    nnz: int = ML20M["nnz"],
    steps: int = 30,
    warmup: int = 5,
    device: str = "auto",
    model: str = "multvae",
    progress: bool = True,
    seed: int = 0,
    data: sp.csr_matrix | None = None,
    cuda_graphs: bool = True,
    kernel: str = "auto",
    on_step: Callable[[], None] | None = None,
) -> TrainBench:
    """Time whole training steps on `data` (default: `synthetic_csr(users, items, nnz)`);
    `on_step` is called after each step, warm-ups included (a profiler's `step`).
    A step is one update of every phase of the model's epoch (RecVAE: 3 encoder updates and 1
    decoder update), so users/s is users of an epoch per second for every model. Where
    training would replay its step as a CUDA graph (`graphs.graphs_apply`), the graph's step is
    timed (breakdown: "graph"), as training runs it."""
    dev = prec.resolve_device(device)
    prec.check_precision(precision, dev)
    if dev.type == "cpu":
        tune_cpu_allocator()
    from vaecf.training.single import make_optimizer

    if data is None:
        data = synthetic_csr(users, items, nnz, seed)
    items = data.shape[1]
    csr = CSR.from_scipy(data, dev)
    torch.manual_seed(seed)
    net = models.build(model, items).to(dev).train()
    if net.closed_form:
        raise ConfigError(f"{model} is fitted in closed form: time `vaecf train --model {model}`")
    graphed = graphs.graphs_apply(net, dev, precision, enabled=cuda_graphs) is None
    choice = first_layer.choose_for(net, csr, batch_size, precision, kernel, graphed)
    kernel, graphed = choice.kernel or "bag", graphed and choice.graphs
    opts = {k: make_optimizer(p, 1e-3, dev) for k, p in net.param_groups().items()}
    phase_steps = [
        (ph, [opts[g] for g in ph.groups]) for ph in net.phases() for _ in range(ph.passes)
    ]
    scaler = prec.grad_scaler(dev, precision)
    gen = torch.Generator().manual_seed(seed)
    if graphed:
        timing = (steps, warmup, gen, on_step)
        r = _bench_graph(net, phase_steps, csr, data, precision, batch_size, *timing)
    else:
        timing = (steps, warmup, gen, progress, on_step)
        r = _bench_eager(net, phase_steps, opts, scaler, csr, precision, batch_size, *timing)
    return dataclasses.replace(r, first_layer=kernel)


def _bench_eager(
    net,
    phase_steps,
    opts,
    scaler,
    csr,
    precision,
    batch_size,
    steps,
    warmup,
    gen,
    progress,
    on_step,
) -> TrainBench:
    """bench_train's timing of eager steps, with the median of each part (the batch's
    gather, forward, backward, optimizer)."""
    dev = csr.device
    parts = {"batch": [], "forward": [], "backward": [], "optimizer": []}
    flops = []
    for i in tqdm(
        range(warmup + steps), desc=f"train {precision}", disable=None if progress else True
    ):
        rows = torch.randint(0, csr.n_rows, (batch_size,), generator=gen).to(dev)
        prec.synchronize(dev)
        t0 = time.perf_counter()
        batch = csr.batch(rows)
        prec.synchronize(dev)
        t1 = time.perf_counter()
        fwd, bwd, opt = _timed_phases(net, phase_steps, opts, scaler, batch, precision, dev)
        if on_step is not None:
            on_step()
        if i >= warmup:
            for k, v in zip(parts, (t1 - t0, fwd, bwd, opt)):
                parts[k].append(v)
            flops.append(step_flops(net, batch_size, batch.indices.numel()))
    step = sum(statistics.median(v) for v in parts.values())
    medians = {k: statistics.median(v) * 1e3 for k, v in parts.items()}
    return _bench_result(precision, batch_size, step, flops, medians)


def _timed_phases(net, phase_steps, opts, scaler, batch, precision, dev) -> tuple:
    """Seconds of forward, backward and optimizer over every phase of one eager step."""
    fwd = bwd = opt = 0.0
    for phase, phase_opts in phase_steps:
        s0 = time.perf_counter()
        with prec.matmul_scope(dev, precision), prec.autocast(dev, precision):
            loss, _ = net.loss(batch, 0.2, batch.batch_size, phase)
        prec.synchronize(dev)
        s1 = time.perf_counter()
        for o in opts.values():
            o.zero_grad(set_to_none=True)
        with prec.matmul_scope(dev, precision):
            scaler.scale(loss).backward()
        prec.synchronize(dev)
        s2 = time.perf_counter()
        for o in phase_opts:
            scaler.step(o)
        scaler.update()
        prec.synchronize(dev)
        fwd, bwd, opt = fwd + s1 - s0, bwd + s2 - s1, opt + time.perf_counter() - s2
    return fwd, bwd, opt


def _bench_result(precision, batch_size, step_s: float, flops: list, breakdown_ms) -> TrainBench:
    return TrainBench(
        precision,
        batch_size,
        batch_size / step_s,
        step_s * 1e3,
        statistics.mean(flops) / step_s / 1e9,
        breakdown_ms,
    )


def _bench_graph(
    net, phase_steps, csr, data, precision, batch_size, steps, warmup, gen, on_step
) -> TrainBench:
    """bench_train's timing of a step replayed as CUDA graphs, one per phase (batches over the
    graphs' capacity are drawn again: training steps those eagerly)."""
    dev = csr.device
    capacity = graphs.graph_capacity(np.diff(data.indptr), batch_size)
    graphed = {}
    for phase, phase_opts in phase_steps:
        if phase.name not in graphed:
            graphed[phase.name] = graphs.GraphedStep(
                net, phase_opts, csr, batch_size, precision, capacity, phase
            )
    sequence = [graphed[phase.name] for phase, _ in phase_steps]
    row_nnz = torch.from_numpy(np.diff(data.indptr))
    times, flops = [], []
    while len(times) < steps:
        rows = torch.randint(0, csr.n_rows, (batch_size,), generator=gen)
        nnz = int(row_nnz[rows].sum())
        if not sequence[0].fits(nnz):
            continue
        rows = rows.to(dev)
        prec.synchronize(dev)
        t0 = time.perf_counter()
        for step in sequence:
            step(rows, 0.2)
        prec.synchronize(dev)
        if on_step is not None:
            on_step()
        if warmup > 0:
            warmup -= 1
            continue
        times.append(time.perf_counter() - t0)
        flops.append(step_flops(net, batch_size, nnz))
    t = statistics.median(times)
    return _bench_result(precision, batch_size, t, flops, {"graph": t * 1e3})


def _percentiles(times: list[float]) -> dict:
    a = np.asarray(times) * 1e3
    return {
        "mean_ms": float(a.mean()),
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p95_ms": float(np.percentile(a, 95)),
        "p99_ms": float(np.percentile(a, 99)),
    }


def bench_infer(
    run_or_items: str | int = ML20M["items"],
    batch_sizes=(1, 1024),
    precision: str = "auto",
    device: str = "cpu",
    history: int = 50,
    seconds: float = 3.0,
    k: int = 100,
    progress: bool = True,
) -> list[dict]:
    """Latency and throughput of scoring + masking seen items + top-k, per batch size."""
    dev = prec.resolve_device(device)
    precision = prec.resolve_precision(precision, dev)
    if dev.type == "cpu":
        tune_cpu_allocator()
    if isinstance(run_or_items, str) and Path(run_or_items).is_dir():
        from vaecf.rundir import load_model

        net = load_model(run_or_items, dev)[0]
    else:
        torch.manual_seed(0)
        net = models.build("multvae", int(run_or_items)).to(dev)
    net, scorer = serving_copy(net, precision)
    items = net.n_items
    out_bytes = roofline.output_layer_bytes(net)
    csr = CSR.from_scipy(
        synthetic_csr(max(batch_sizes) * 4, items, max(batch_sizes) * 4 * history, seed=1), dev
    )
    out = []
    for bs in batch_sizes:
        times = _answer_times(scorer, csr, bs, seconds, min(k, items), dev, progress)
        times = times[max(1, len(times) // 10) :]  # drop warm-up
        stats = _percentiles(times)
        out.append(
            {
                "batch_size": bs,
                "precision": precision,
                "users_per_s": bs / statistics.mean(times),
                "n": len(times),
                "output_layer_bytes": out_bytes,
                **stats,
            }
        )
    return out


def _answer_times(scorer, csr: CSR, bs: int, seconds: float, k: int, dev, progress: bool) -> list:
    """Seconds of each answer (batch, scores, seen items masked, top k) to batches of `bs`
    rows of `csr`, for `seconds` (at least 20 answers, at most 100,000)."""
    times = []
    deadline = time.perf_counter() + seconds
    n = 0
    bar = tqdm(desc=f"infer batch {bs}", disable=None if progress else True, unit="batch")
    with torch.inference_mode():
        while (time.perf_counter() < deadline or n < 20) and n < 100_000:
            rows = torch.arange(n * bs, (n + 1) * bs, device=dev) % csr.n_rows
            t0 = time.perf_counter()
            batch = csr.batch(rows)
            scores = scorer(batch).float()
            scores[batch.row_ids, batch.indices] = -torch.inf
            top = scores.topk(k, dim=1).indices
            if dev.type == "cuda":
                top.cpu()
            times.append(time.perf_counter() - t0)
            n += 1
            bar.update(1)
    bar.close()
    return times


def bench_eval(
    items: int = ML20M["items"],
    users: int = 10_000,
    history: int = 50,
    batch_size: int = 2000,
    precision: str = "auto",
    device: str = "auto",
    repeats: int = 3,
) -> dict:
    """Seconds for one full fold-in evaluation (Recall@20/50, NDCG@100 with the fold-in mask)
    of a fresh Mult-VAE over `users` held-out users: the validation pass of every epoch."""
    from vaecf.evaluate import evaluate_model

    dev = prec.resolve_device(device)
    precision = prec.resolve_precision(precision, dev)
    prec.check_precision(precision, dev)
    if dev.type == "cpu":
        tune_cpu_allocator()
    m = synthetic_csr(users, items, users * history, seed=2)
    rng = np.random.default_rng(2)
    hold = rng.random(m.nnz) < 0.2  # 80/20 fold-in / target
    fold_in, target = m.copy(), m.copy()
    fold_in.data[hold], target.data[~hold] = 0, 0
    fold_in.eliminate_zeros()
    target.eliminate_zeros()
    fold_in, target = CSR.from_scipy(fold_in, dev), CSR.from_scipy(target, dev)
    torch.manual_seed(0)
    net = models.build("multvae", items).to(dev)
    times = []
    for _ in range(repeats + 1):
        prec.synchronize(dev)
        t0 = time.perf_counter()
        metrics = evaluate_model(net, fold_in, target, batch_size=batch_size, precision=precision)
        prec.synchronize(dev)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times[1:])  # the first is a warm-up
    return {
        "users": users,
        "items": items,
        "precision": precision,
        "batch_size": batch_size,
        "seconds": seconds,
        "users_per_s": users / seconds,
        "n_users": metrics["n_users"],
    }
