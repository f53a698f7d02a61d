"""A training step replayed as a CUDA graph.

On a large GPU a Mult-VAE step at the paper's batch of 500 is bound by launching its ~150
kernels from Python, not by the GPU's arithmetic (RecVAE's epoch of 3 encoder steps and 1
decoder step launches ~970). Captured once as a CUDA graph, the whole step (the batch's gather
from the device-resident training matrix, forward, backward and Adam) is then launched as one
(H200, ML-20M shape: fp32 148,900 -> 180,600 users/s, bf16 123,900 -> 220,900;
probe cuda_graph_probe: benchmarks/README.md). A model of several phases (RecVAE) gets one
graph per phase, each stepping that phase's optimizers.

A graph replays fixed shapes and must not wait on the GPU, so the batch is gathered into a fixed
number of non-zero slots (`CSR.padded_batch`: the padding adds exactly zero to every sum).
Full batches whose non-zeros fit replay the graph; the epoch's last, smaller batch (the same
size every epoch) replays a graph of its own where the GPU has room for it (`StepGraphs`); a
batch over the capacity runs eagerly, as without graphs. Capturing runs a few warm-up steps;
the parameters, Adam's state and the RNG are put back afterwards, so a capture changes nothing
in the run's state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch

from vaecf import precision as prec
from vaecf.data.matrix import CSR, SparseBatch

_WARMUP = 3  # steps on a side stream before capture (PyTorch's recipe)
_ROUND = 4096  # capacities are multiples of this


def graph_capacity(row_nnz: np.ndarray, batch_size: int) -> int:
    """Non-zero slots for a batch of `batch_size` random rows: the mean total plus six standard
    deviations of a sum of that many rows (by the central limit theorem a batch over it is
    rare; it then runs eagerly), never more than the largest rows' total, rounded up. A
    function of the data alone, so a resumed run captures the same shapes."""
    n = np.asarray(row_nnz, dtype=np.float64)
    b = min(batch_size, n.size)
    bound = b * n.mean() + 6.0 * math.sqrt(b) * n.std()
    most = float(np.sort(n)[-b:].sum())
    return int(max(_ROUND, math.ceil(min(bound, most) / _ROUND) * _ROUND))


def graphs_apply(
    model,
    device: torch.device,
    precision: str,
    world: int = 1,
    enabled: bool = True,
    data_on: str = "device",
) -> str | None:
    """Why a training step of `model` cannot be a graph here (None: it can)."""
    if not enabled:
        return "--cuda-graphs false"
    if device.type != "cuda":
        return "not on a GPU"
    if world > 1:
        return "data-parallel"
    if data_on != "device":
        return "--data-on host"
    if precision == "fp16":  # dynamic loss scaling skips steps on the host's word
        return "fp16"
    if not getattr(model, "graph_step", False):
        return f"{model.name} steps eagerly"
    return None


class GraphedStep:
    """One full batch's training step of `phase` (None: a single-phase model), stepping `opts`,
    captured once, then replayed for each batch: `step(rows, beta)` returns the step's detached
    loss parts (tensors that the next replay overwrites)."""

    def __init__(
        self, model, opts: list, csr: CSR, batch_size: int, precision: str, capacity, phase=None
    ):
        self.model, self.opts, self.csr, self.phase = model, opts, csr, phase
        self.batch_size, self.precision, self.capacity = batch_size, precision, capacity
        self.device = csr.device
        self.rows = torch.arange(batch_size, device=self.device) % csr.n_rows
        self.beta = torch.zeros((), device=self.device)
        for o in opts:  # a graph may hold Adam's step only with its step count on the device
            for g in o.param_groups:
                g["capturable"] = True
            o.defaults["capturable"] = True
        saved = self._snapshot()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUP):
                self._zero_grad()
                self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self._zero_grad()
        with torch.cuda.graph(self.graph):
            self.parts = self._step()
        self._restore(saved)

    def fits(self, total: int) -> bool:
        return total <= self.capacity

    def __call__(self, rows: torch.Tensor, beta: float) -> dict:
        self.rows.copy_(rows)
        self.beta.fill_(beta)
        self.graph.replay()
        return self.parts

    def _zero_grad(self) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=True)

    def _step(self) -> dict:
        batch = self.csr.padded_batch(self.rows, self.capacity)
        with prec.autocast(self.device, self.precision):
            loss, parts = self.model.loss(batch, self.beta, self.batch_size, self.phase)
        loss.backward()
        for o in self.opts:
            o.step()
        return parts

    def _snapshot(self) -> dict:
        params = [p for o in self.opts for g in o.param_groups for p in g["params"]]
        state = {
            (i, k): v.detach().clone()
            for o in self.opts
            for i, p in enumerate(params)
            for k, v in o.state.get(p, {}).items()
            if torch.is_tensor(v)
        }
        return {
            "params": [(p, p.detach().clone()) for p in params],
            "state": state,
            "rng": torch.cuda.get_rng_state(self.device),
        }

    @torch.no_grad()
    def _restore(self, saved: dict) -> None:
        """The parameters, Adam's state (zero where the warm-up created it: Adam's initial
        state) and the RNG as before the capture, in place: the graph holds these tensors."""
        params = [p for p, _ in saved["params"]]
        for p, before in saved["params"]:
            p.copy_(before)
        for o in self.opts:
            for i, p in enumerate(params):
                for k, v in o.state.get(p, {}).items():
                    if torch.is_tensor(v):
                        before = saved["state"].get((i, k))
                        v.copy_(before) if before is not None else v.zero_()
        torch.cuda.set_rng_state(saved["rng"], self.device)


class StepGraphs:
    """A run's training steps as CUDA graphs, each phase's captured at its first use (after a
    resume has loaded the state: a graph holds the parameters and Adam's state tensors): one
    for full batches of `batch_size` rows of `csr` and, where `room(rows)` says the GPU can
    hold another, one for the epoch's last, smaller batch."""

    def __init__(
        self, model, csr: CSR, batch_size: int, precision: str, room: Callable[[int], bool]
    ):
        self.model, self.csr, self.batch_size, self.precision = model, csr, batch_size, precision
        self.room = room
        self.row_nnz = csr.row_nnz().cpu()  # batch totals read here: nothing waits on the GPU
        self.capacity = graph_capacity(self.row_nnz.numpy(), batch_size)
        self.graphs: dict[tuple, GraphedStep | None] = {}

    def graph(self, phase, opts: list, rows: int) -> GraphedStep | None:
        """The phase's graph for batches of `rows` rows (None: they run eagerly)."""
        key = (phase.name, rows)
        if key not in self.graphs:
            full = rows == self.batch_size
            if full or self.room(rows):
                cap = self.capacity if full else graph_capacity(self.row_nnz.numpy(), rows)
                self.graphs[key] = GraphedStep(
                    self.model, opts, self.csr, rows, self.precision, cap, phase
                )
            else:
                self.graphs[key] = None
        return self.graphs[key]

    def steps(
        self, phase, opts: list, perm: torch.Tensor
    ) -> Iterator[tuple[torch.Tensor, GraphedStep | SparseBatch]]:
        """(rows on the device, the graph to replay) for each batch of the permutation `perm`
        whose non-zeros fit its graph, (rows, the batch) for the others, which run eagerly."""
        lens = self.row_nnz[perm].split(self.batch_size)
        for rows, ln in zip(perm.to(self.csr.device).split(self.batch_size), lens):
            graph = self.graph(phase, opts, rows.numel())
            if graph is not None and graph.fits(int(ln.sum())):
                yield rows, graph
            else:
                yield rows, self.csr.batch(rows)
