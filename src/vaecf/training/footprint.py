"""What a gradient model's training will hold on its device, worked out before anything large is
allocated (free memory: vaecf.memory; the closed-form models check their own:
`vaecf.models.linear.check_memory`).

A training process holds, per parameter, its weight, its gradient and Adam's two moments (16
bytes in fp32, and 1 byte of allocator slack, measured; plus a 2-byte cast per weight under
bf16/fp16 autocast, and 4 bytes of gradient buckets under data-parallel training); per step,
the batch's item-sized activations (logits, softmax and their gradient: 12 bytes per user and
item, measured on Mult-VAE at 100,000 items: 11); the training split; and, on the host, the
checkpoint copies: last.pt's snapshot of weights and moments and the best model's weights,
written by a background thread while training goes on (up to 5 floats per parameter: one save
being written while a new best is kept). Where those copies do not fit, last.pt is written in
the foreground from the live tensors (training waits for the disk) and only the best model's
copy is kept. A process also holds ~300 MiB of Python, PyTorch and libraries (RUNTIME_BYTES).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from vaecf import memory, models
from vaecf.config.train import TrainConfig
from vaecf.data.prepare import PreparedDataset
from vaecf.distributed import DistContext
from vaecf.errors import RunError
from vaecf.memory import gib, items_cut

ACTIVATION_BYTES = 12  # per (user in the batch, item): logits, softmax and their gradient
# per trained parameter beyond its weight, gradient and moments: what the allocator keeps besides
# (measured: at 469M parameters the peak was 0.4 GiB above 16 bytes a parameter)
SLACK_BYTES = 1
RUNTIME_BYTES = 300 * 2**20  # a process's Python, PyTorch and libraries before any data
BACKGROUND_COPIES = 5  # floats per parameter kept for checkpoints written in the background
FOREGROUND_COPIES = 1  # the best model's weights, when last.pt is written in the foreground


@dataclass
class TrainMemory:
    """Bytes a training process needs, by part (see the module's docstring)."""

    n_items: int
    trained: int  # parameters the optimizers step
    state: int  # weights, gradients, Adam moments, half-width casts, other parameters/buffers
    batch: int  # a step's item-sized activations
    data: int  # the training split in memory
    per_item: float  # bytes per item of all but the data (what dropping items saves)
    prepare: int = 0  # what the model's prepare holds before the first epoch (a linear fit)

    def copies(self, background: bool) -> int:
        return 4 * self.trained * (BACKGROUND_COPIES if background else FOREGROUND_COPIES)

    def transient(self, batch: float | None = None) -> float:
        """A step's activations or, before the first epoch, prepare's arrays: never both."""
        return max(self.batch if batch is None else batch, self.prepare)

    def need(self, background: bool = True) -> int:
        """On one CPU process: everything, the runtime included."""
        return int(
            RUNTIME_BYTES + self.state + self.transient() + self.data + self.copies(background)
        )


def train_memory(
    model_name: str,
    n_items: int,
    model_cfg,
    batch_size: int,
    precision: str,
    nnz: int,
    ddp: bool = False,
) -> TrainMemory:
    """What training `model_name` over `n_items` will hold (see the module's docstring; `ddp`:
    data-parallel, whose gradient buckets are another 4 bytes per parameter); the parameters
    are counted on a model built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        net = models.build(model_name, n_items, model_cfg)
    groups = net.param_groups().values()
    trained_ids = {id(p) for ps in groups for p in ps}
    trained = sum(p.numel() for p in net.parameters() if id(p) in trained_ids)
    rest = sum(p.numel() for p in net.parameters() if id(p) not in trained_ids)
    rest += sum(b.numel() for b in net.buffers())
    cast = 2 * trained if precision in ("bf16", "fp16") else 0
    state = (16 + SLACK_BYTES + (4 if ddp else 0)) * trained + cast + 4 * rest
    batch = ACTIVATION_BYTES * batch_size * n_items
    data = 12 * nnz  # a float value and an int64 index per interaction
    prepare = net.prepare_bytes()
    # what each item costs (the rest, hidden layers, counted as if it grew with the items too;
    # a cost that grows with their square is over-counted for fewer items: advice errs safe)
    per_item = (state + 4 * trained * FOREGROUND_COPIES + max(batch, prepare)) / max(n_items, 1)
    return TrainMemory(n_items, trained, state, batch, data, per_item, prepare)


def graph_step_bytes(model: torch.nn.Module, batch_size: int, n_items: int) -> int:
    """What CUDA graphs of `model`'s steps still need once it is built: a step's activations
    and gradients for each phase's graph and again for the eager steps (the epoch's last),
    and Adam's moments (a fresh run's)."""
    params = sum(p.numel() for p in model.parameters())
    steps = 1 + len(model.phases())
    batch = ACTIVATION_BYTES * batch_size * n_items
    return steps * batch + 16 * params


def check_train_memory(
    mem: TrainMemory,
    device: torch.device,
    title: str,
    batch_size: int,
    item_users: Callable[[], np.ndarray] | None = None,
    processes: int = 1,
    world: int = 1,
) -> tuple[bool, str]:
    """Whether checkpoints can be written in the background, and a line saying what training
    will hold; refuses (RunError), with the figures and what would help, when even foreground
    checkpoints do not fit. `batch_size`: a process's users per step; `item_users()`: each
    item's number of users (called only to advise a cut); `processes`: training processes
    sharing this machine's memory; `world`: all of them (--batch-size is split across them)."""
    free_on = memory.free_memory(device)
    host_on = memory.free_memory(torch.device("cpu")) if device.type != "cpu" else free_on
    free, host = free_on.bytes, host_on.bytes
    share = f" a process, x {processes} processes on this machine" if processes > 1 else ""
    on_host = mem.data + RUNTIME_BYTES

    def fits(background: bool, batch: float = mem.batch) -> bool:  # rank 0 alone keeps copies
        copies, on_device = mem.copies(background), mem.state + mem.transient(batch)
        if device.type == "cpu":
            return processes * (on_device + on_host) + copies <= free
        return on_device <= free and processes * on_host + copies <= host

    parts = (
        f"weights, gradients and Adam {gib(mem.state)}, a batch of {batch_size:,} "
        f"{gib(mem.batch)}, data {gib(mem.data)}, runtime {gib(RUNTIME_BYTES)}"
        + (f", the linear path's fit before training {gib(mem.prepare)}" if mem.prepare else "")
    )
    for background in (True, False):
        if fits(background):
            how = "in the background" if background else "in the foreground: no room to copy"
            where = f"{gib(free)} free on {device} ({free_on.limit})" + (
                f", {gib(host)} on the host ({host_on.limit})" if device.type != "cpu" else ""
            )
            return background, (
                f"{title}, {mem.trained:,} parameters: training holds about "
                f"{gib(mem.need(background))}{share} of {where} ({parts}, checkpoint copies "
                f"{gib(mem.copies(background))}, written {how})"
            )
    limit = free if device.type == "cpu" else min(free, host)
    advice = _advice(mem, limit, processes, world, batch_size, item_users, fits)
    what = f"{title}, {mem.trained:,} parameters: training"
    parts = f"{share} ({parts}, a copy of the best model {gib(mem.copies(False))})"
    limited, on = (free_on, device) if device.type == "cpu" or free <= host else (host_on, "cpu")
    raise RunError(memory.refusal(what, mem.need(False), limited, torch.device(on), advice, parts))


def _advice(mem, limit, processes, world, batch_size, item_users, fits) -> list[str]:
    """What would let a refused training fit: fewer items, a smaller batch (where `fits` says
    it would), fewer processes, a narrower layer or more memory."""
    advice = []
    fit_items = int(max(limit / processes - mem.data - RUNTIME_BYTES, 0) / mem.per_item)
    if item_users is not None and 0 < fit_items < mem.n_items:
        cut, kept = items_cut(item_users(), fit_items)
        if kept:
            advice.append(
                f"keep the {kept:,} items with at least {cut} users (prepare again with "
                f"--min-item-users {cut})"
            )
    smaller = max(1, batch_size // 4)
    if batch_size > 1 and fits(False, mem.batch * smaller / batch_size):
        advice.append(
            f"--batch-size {smaller * world} ({gib(mem.batch * smaller / batch_size)} a batch)"
        )
    if processes > 1:
        advice.append("fewer processes per machine")
    advice.append("a narrower first hidden layer, or a machine/device with more memory")
    return advice


def check_training(
    model_name: str,
    model_cfg,
    cfg: TrainConfig,
    ds: PreparedDataset,
    device: torch.device,
    ctx: DistContext,
    item_users: Callable[[], np.ndarray],
) -> tuple[bool, str]:
    """What training `model_name` on `ds` under `cfg` will hold (weights, gradients, Adam, a
    batch, the data, checkpoint copies): `check_train_memory`'s answer for a training process
    (its share of the batch under torchrun), refused on every rank if one machine cannot hold
    it (none waits). `item_users`: each item's number of training users."""
    counts = ds.manifest["counts"]
    fold_in = getattr(model_cfg, "fold_in_rows", False)
    # a step's users: the batch (at most every training user), split across the processes
    batch = min(cfg.batch_size, max(counts.get("n_train_users", 0), 1))
    batch = -(-batch // ctx.world) if ctx.enabled else batch
    mem = train_memory(
        model_name,
        ds.n_items,
        model_cfg,
        batch,
        cfg.precision,
        counts.get("nnz_train", 0)
        + sum(counts.get(f"nnz_{k}_tr", 0) for k in ("validation", "test") if fold_in),
        ddp=ctx.enabled,
    )
    title = models.get(model_name).title
    refused = answer = None
    try:
        answer = check_train_memory(
            mem,
            device,
            title,
            batch,
            item_users,
            memory.local_processes() if ctx.enabled else 1,
            ctx.world if ctx.enabled else 1,
        )
    except RunError as e:
        refused = str(e)
    if ctx.enabled:  # every rank stops if one machine cannot hold it (none waits)
        said = ctx.gather(refused)
        refused = refused or next((f"rank {i}: {m}" for i, m in enumerate(said) if m), None)
    if refused:
        raise RunError(refused)
    return answer
