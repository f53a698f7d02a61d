"""The gradient models' fit (`GradientFit`, on run's `Run`): epochs of phases (each phase steps
its own optimizers), KL annealing, precision, CUDA graphs, data parallelism, checkpoints and
bit-for-bit resume (what last.pt holds: resume), early stopping and a time budget, model
selection on validation, then the test.
"""

from __future__ import annotations

import functools
import json
import math
import time

import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from vaecf import memory, rundir
from vaecf import precision as prec
from vaecf.config.settings import spelled
from vaecf.config.specs import FORECAST_MARGIN
from vaecf.data.matrix import CSR, prefetch_batches
from vaecf.errors import RunError, TrainingDiverged
from vaecf.models import Phase, first_layer
from vaecf.models.base import LossModule, make_optimizer
from vaecf.storage import checkpoint
from vaecf.training import footprint, graphs, resume
from vaecf.training.background import CheckpointWriter, snapshot
from vaecf.training.run import Run, RunResult


class GradientFit(Run):
    """Gradient models: epochs of phases, checkpoints, resume, model selection."""

    def __init__(self, *args, **kwargs):
        self.background_checkpoints = True
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        host = cfg.data_on == "host"
        self.train_csr = CSR.from_scipy(self._train_rows(), "cpu" if host else self.device)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.opts = {
            name: make_optimizer(params, cfg.lr, self.device)
            for name, params in self.model.param_groups().items()
        }
        self.scaler = prec.grad_scaler(self.device, cfg.precision)
        self.step_module: torch.nn.Module = LossModule(self.model)  # DDP-wrapped in fit()
        self._best_state: dict | None = None  # a best model not yet written to best.pt
        self._best_weights: dict | None = None  # the last best model's weights (host copies)
        # the run's CUDA graphs; False: no graphs; None: not yet decided
        self._graph: graphs.StepGraphs | bool | None = None
        self.graph_steps = 0  # steps of this process replayed as a CUDA graph
        self._val_seconds = 0.0  # the last validation's time, for the budget's forecast
        self.warm = False  # an update's warm start: validated first, kept if no epoch beats it

    def _train_rows(self) -> sp.csr_matrix:
        """What the model trains on: the training users' rows, and with the model's
        `fold_in_rows` the held-out users' fold-in rows after them (never their targets)."""
        train = self.ds.split("train")
        if not getattr(self.model_cfg, "fold_in_rows", False):
            return train
        parts = [train, self.ds.split("validation_tr"), self.ds.split("test_tr")]
        return sp.vstack(parts).tocsr()

    def check_memory(self) -> None:
        """What training will hold, stated, and refused with the figures before anything large
        is allocated (footprint.check_training); where the background checkpoints' copies
        do not fit, last.pt is written in the foreground."""
        self.background_checkpoints, plan = footprint.check_training(
            self.model_name,
            self.model_cfg,
            self.cfg,
            self.ds,
            self.device,
            self.ctx,
            lambda: self._train_rows().getnnz(axis=0),
        )
        if self.cfg.progress and self.ctx.is_main:
            tqdm.write(plan)

    # -- run directory ------------------------------------------------------------------------
    def _save_last(self) -> None:
        """last.pt now (and best.pt before it if the best model changed): vaecf.training.resume."""
        self._last_saved = time.perf_counter()
        if not self.ctx.is_main:
            return
        resume.save_last(
            self.writer,
            self.out,
            resume.last_state(self),
            self._best_state,
            self._metrics_file,
            self.background_checkpoints,
        )
        self._best_state = None

    # -- training -----------------------------------------------------------------------------
    def _batches(self, perm: torch.Tensor):
        cfg, ctx = self.cfg, self.ctx
        if cfg.data_on == "device":
            perm = perm.to(self.device)
        global_rows = perm.split(cfg.batch_size)
        shards = [ctx.shard(rows) for rows in global_rows]
        if cfg.data_on == "host":
            batches = prefetch_batches(self.train_csr, shards, self.device)
        else:
            batches = (self.train_csr.batch(rows) for rows in shards)
        return zip(global_rows, batches)

    def train_epoch(self) -> dict:
        self.model.train()
        cfg, ctx, n = self.cfg, self.ctx, self.train_csr.n_rows
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)  # NLL, KL, KL term, n
        t0 = time.perf_counter()
        with prec.matmul_scope(self.device, cfg.precision):
            self._run_phases(totals)
        ctx.all_reduce_sum(totals)
        users = totals[3].item() or 1.0  # waits for the GPU: replays are queued, not run
        seconds = time.perf_counter() - t0
        nll, kl, term = (totals[:3] / users).tolist()
        passes = sum(p.passes for p in self.model.phases())
        return {
            "loss": nll + term,
            "nll": nll,
            "kl": kl,
            "beta": cfg.beta_at(self.step - 1),
            "train_seconds": round(seconds, 4),
            "users_per_s": round(n * passes / seconds, 1),
        }

    def _graphed(self) -> graphs.StepGraphs | None:
        """The run's CUDA graphs of its steps (`graphs.StepGraphs`), or None where graphs do not
        apply (`graphs.graphs_apply`) or the GPU lacks room for a full batch's."""
        if self._graph is None:  # decided once for the run
            cfg = self.cfg
            why = self._why_no_graph
            need = footprint.graph_step_bytes(self.model, cfg.batch_size, self.ds.n_items)
            if why is None and memory.available_bytes(self.device) < need:
                why = f"the GPU has less than {memory.gib(need)} free for a graph's step"
                if cfg.progress and self.ctx.is_main:
                    tqdm.write(f"CUDA graphs off: {why}; each step runs eagerly")
            if why is not None:
                self._graph = False
            else:
                self._graph = graphs.StepGraphs(
                    self.model, self.train_csr, cfg.batch_size, cfg.precision, self._graph_room
                )
                if cfg.progress and self.ctx.is_main:
                    n = f"{self._graph.capacity:,}"
                    tqdm.write(f"CUDA graphs: full batches (up to {n} interactions) as one graph")
        return self._graph or None

    def _graph_room(self, rows: int) -> bool:
        """Whether the GPU has room for another graph's step of `rows` rows."""
        need = footprint.graph_step_bytes(self.model, rows, self.ds.n_items)
        return memory.available_bytes(self.device) >= need

    def _run_phases(self, totals: torch.Tensor) -> None:
        cfg, ctx, n = self.cfg, self.ctx, self.train_csr.n_rows
        for phase in self.model.phases():
            self.model.begin_phase(phase)
            opts = [self.opts[g] for g in phase.groups]
            graphed = self._graphed()
            for _ in range(phase.passes):
                perm = torch.randperm(n, generator=self.gen)  # the same on every rank
                steps = graphed.steps(phase, opts, perm) if graphed else self._batches(perm)
                for rows, step in steps:
                    beta = cfg.beta_at(self.step)
                    if isinstance(step, graphs.GraphedStep):  # a batch that fits its graph
                        parts = step(rows, beta)
                        self.graph_steps += 1
                    else:
                        parts = self._eager_step(step, beta, rows.numel() / ctx.world, phase, opts)
                    self.step += 1
                    if phase.log:
                        totals[0] += parts["nll_sum"]
                        if "kl_sum" in parts:
                            totals[1] += parts["kl_sum"]
                            totals[2] += parts["kl_term_sum"]
                if phase.log:
                    totals[3] += n

    def _eager_step(self, batch, beta: float, denom: float, phase: Phase, opts: list) -> dict:
        with prec.autocast(self.device, self.cfg.precision):
            loss, parts = self.step_module(batch, beta, denom, phase)
        for o in self.opts.values():
            o.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        for o in opts:
            self.scaler.step(o)
        self.scaler.update()
        return parts

    def fit(self) -> RunResult:
        cfg = self.cfg
        t_setup = time.perf_counter()
        ck = resume.read_last(self.out, self.ctx)
        if ck is not None:
            resume.restore(ck, self)
        self.write_config()
        if self._done() is not None and self.finished():
            return self.result()
        if self.epoch == 0:
            self._prepare_model()
        if self._done() is None and self.ctx.is_main:  # extending a finished run: its
            (self.out / rundir.RESULTS).unlink(missing_ok=True)  # results are no longer the run's
        self._choose_first_layer()
        if self.ctx.enabled:
            self._wrap_data_parallel()
        self.writer = CheckpointWriter()
        if self.ctx.is_main:  # closed below, when training ends
            self._metrics_file = resume.open_metrics(self.out / rundir.METRICS, self.history)
        show = cfg.progress and self.ctx.is_main
        bar = tqdm(
            total=cfg.epochs,
            initial=self.epoch,
            desc="train",
            unit="epoch",
            disable=None if show else True,  # None: no bar when stderr is not a terminal
            dynamic_ncols=True,
        )
        timing = {"setup_s": time.perf_counter() - t_setup, "train_s": 0.0, "validation_s": 0.0}
        if self.warm and self.epoch == 0:  # the update's starting point: best until beaten
            self._validate_start(timing)
        self._last_saved = time.perf_counter()
        deadline = self.deadline
        stop = resume.StopRequests(enabled=not self.ctx.enabled)
        try:
            with stop:
                while self.stopped is None and self._done() is None:
                    self.stopped = self._run_epoch(timing, deadline, stop, show)
                    bar.update(1)
                    bar.set_postfix(
                        loss=f"{self.history[-1]['loss']:.2f}",
                        best=f"{self.best['value']:.4f}@{self.best['epoch']}",
                    )
            self.stopped = self.stopped or self._done()
            if show and self.stopped in ("patience", "budget"):
                tqdm.write(self._stop_line())
            timing["graph_steps"] = self.graph_steps
            written = functools.partial(self._written, timing)  # the test runs meanwhile
            return self.finish(timing, t_setup, self._best_weights, written)
        finally:
            bar.close()
            if self.ctx.is_main:
                self._metrics_file.close()
            self.writer.close()

    def _written(self, timing: dict) -> None:
        """Wait for the last checkpoints (best.pt, then last.pt) to be on disk; their figures
        into `timing`."""
        self.writer.flush()
        timing["checkpoint_wait_s"] = self.writer.wait_seconds
        timing["checkpoint_bytes"] = self.writer.bytes_written
        timing["checkpoint_writes"] = self.writer.writes

    def _prepare_model(self) -> None:
        """A new run: the model's data-dependent parts, if it has any (what they chose goes on
        the run's card)."""
        val = (self.ds.split("validation_tr"), self.ds.split("validation_te"))
        with self.discarded_if_it_fails():
            prepared = self.model.prepare(self._train_rows(), val)
        if prepared and self.cfg.progress and self.ctx.is_main:
            tqdm.write(
                f"{self.model.title}: " + ", ".join(f"{k} {v:g}" for k, v in prepared.items())
            )
        if self.model.config != self.model_cfg:
            self.model_cfg = self.model.config
            self.write_config()

    def _choose_first_layer(self) -> None:
        """Whether steps can be CUDA graphs, and the sparse first layer's training kernel
        (models/first_layer.choose_for; recorded in results.json)."""
        cfg = self.cfg
        self._why_no_graph = graphs.graphs_apply(  # decided once for the run
            self.model, self.device, cfg.precision, self.ctx.world, cfg.cuda_graphs, cfg.data_on
        )
        choice = first_layer.choose_for(
            self.model, self.train_csr, cfg.batch_size, cfg.precision, cfg.first_layer,
            graphed=self._why_no_graph is None,
        )  # fmt: skip
        if not choice.graphs and self._why_no_graph is None:
            self._why_no_graph = "the CSR first layer, faster eagerly than any graphed step"
        if choice.kernel is not None:
            graphed = self._why_no_graph is None
            self.facts["first_layer"] = dict(
                kernel=choice.kernel, ms=choice.ms, cuda_graphs=graphed
            )
            if choice.ms and cfg.progress and self.ctx.is_main:
                tqdm.write(f"first layer: {choice.kernel} (forward + backward ms: {choice.ms})")

    def _wrap_data_parallel(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        self.step_module = DistributedDataParallel(
            self.step_module,
            device_ids=ids,
            find_unused_parameters=len(self.opts) > 1,  # phases leave groups unused
        )

    def _done(self) -> str | None:
        """Why no further epoch is due: "epochs" (all trained) or "patience" (the last
        `patience` epochs found no better validation metric); None: train on."""
        if self.epoch >= self.cfg.epochs:
            return "epochs"
        patience = self.cfg.patience
        validated = self.best["value"] > -math.inf
        if patience and validated and self.epoch - self.best["epoch"] >= patience:
            return "patience"
        return None

    def _run_epoch(self, timing: dict, deadline: float | None, stop, show: bool) -> str | None:
        """Train one epoch, validate it when due, record and checkpoint it. Returns "budget"
        when the next epoch would end past the deadline (this one is then validated), else
        None (the caller asks `_done`)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        row = {"epoch": self.epoch + 1, "step": None, **self.train_epoch()}
        now = time.perf_counter()
        timing["train_s"] += now - t0
        self.epoch += 1
        row["step"] = self.step
        if not math.isfinite(row["loss"]):
            raise TrainingDiverged(
                f"the training loss became {row['loss']} at epoch {self.epoch}; "
                "train a new run with a lower --lr, or with --precision fp32"
            )
        # the next epoch's end: this one's validation, then its training and validation
        next_ends = now + FORECAST_MARGIN * ((now - t0) + 2 * self._val_seconds)
        over = deadline is not None and next_ends > deadline
        if deadline is not None and self.ctx.enabled:  # rank 0's clock decides for every rank
            over = self.ctx.from_main(over)
        last = over or self._done() == "epochs"
        if self.epoch % cfg.eval_every == 0 or last:
            t0 = time.perf_counter()
            self._validate_epoch(row, show)
            self._val_seconds = time.perf_counter() - t0
            timing["validation_s"] += self._val_seconds
        self.history.append(row)
        if self.ctx.is_main:
            if not self.out.is_dir():  # its files would go on into the void, or recreate it
                raise RunError(
                    f"{checkpoint.gone(self.out)}: stopped after epoch {self.epoch}, writing "
                    "nothing; a moved run continues from its last checkpoint with --resume"
                )
            self._metrics_file.write(json.dumps(row) + "\n")
            self._metrics_file.flush()  # readable as it goes; fsync'd with last.pt
        due = time.perf_counter() - self._last_saved >= cfg.checkpoint_every
        if due or last or self._done() is not None or stop.requested:
            self._save_last()
        if self.on_epoch is not None:
            self.on_epoch(row)
        if stop.requested:
            raise KeyboardInterrupt(
                f"stopped after epoch {self.epoch}; its checkpoint is saved in {self.out}: "
                f"continue with {spelled('resume', True)}"
            )
        return "budget" if over and self._done() is None else None

    def _stop_line(self) -> str:
        best, metric = self.best["epoch"], self.cfg.select_metric
        if self.stopped == "patience":
            why = f"no better validation {metric} in {self.cfg.patience} epochs"
        else:
            why = f"another epoch would end past the {self.cfg.budget:.0f} s budget"
        best = "the warm start (epoch 0)" if best == 0 else f"epoch {best}"
        return f"stopped after epoch {self.epoch}: {why}; the best, {best}, is kept"

    def _validate_start(self, timing: dict) -> None:
        """An update's warm start validated as epoch 0: kept where no epoch of its own beats it."""
        t0 = time.perf_counter()
        self._validate_epoch({"epoch": 0}, False)
        timing["validation_s"] = self._val_seconds = time.perf_counter() - t0

    def _validate_epoch(self, row: dict, show: bool) -> None:
        cfg = self.cfg
        val = self.validate()
        row["validation"] = val
        if val[cfg.select_metric] > self.best["value"]:
            self.best = {"epoch": self.epoch, "value": val[cfg.select_metric], "metrics": val}
            if self.ctx.is_main:  # written with the next last.pt (see _save_last)
                self._best_state = self._best_weights = None  # the old copy freed first
                state = {"model": self.model.state_dict(), "epoch": self.epoch, "metrics": val}
                self._best_state = snapshot(state)
                self._best_weights = self._best_state["model"]  # the test's, without best.pt
        if show:
            tqdm.write(_epoch_line(row, cfg.select_metric, self.best["epoch"] == self.epoch))


def _epoch_line(row: dict, metric: str, is_best: bool) -> str:
    val = row["validation"]
    shown = "  ".join(
        f"{k} {val[k]:.4f}" for k in ("recall@20", "recall@50", "ndcg@100") if k in val
    )
    return (
        f"epoch {row['epoch']:4d}  loss {row['loss']:9.3f}  {shown}"
        f"  {row['users_per_s']:8.0f} users/s{'  *' if is_best else ''}"
    )
