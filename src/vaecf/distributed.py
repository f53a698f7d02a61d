"""Data-parallel training under torchrun: environment detection, user sharding, all-reduce.

`torchrun --nproc_per_node N -m vaecf train ...` runs the same command in N processes (on one or
many nodes). Every rank draws the same epoch permutation; each global batch is split into
contiguous per-rank shards; DDP averages the gradients (NCCL on GPUs, gloo on CPUs). Losses are
scaled so that the averaged gradient is that of the mean over the global batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int = 0  # this process's rank among all processes
    world: int = 1  # number of processes
    local_rank: int = 0  # rank on this node (selects the GPU)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of a global batch of user indices."""
        return rows.tensor_split(self.world)[self.rank] if self.enabled else rows

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def from_main(self, obj):
        """Rank 0's `obj` on every rank (pickled): what rank 0 read from its own file system,
        which the other ranks (other nodes) need not share."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def setup(device: str) -> tuple[DistContext, str]:
    """Initialise the process group when started by torchrun; returns the context and the
    device to use (each rank's own GPU under CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(), device
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device in ("auto", "cuda") and torch.cuda.is_available() or device.startswith("cuda")
    if use_cuda:
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    elif device == "auto":
        device = "cpu"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return DistContext(rank, world, local), device


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
