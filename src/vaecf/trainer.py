"""Trainer: fits any model of the contract (models/base.py) into a run directory (rundir.py).

Gradient models: epochs of phases (each phase steps its own optimizers), KL annealing, precision,
data parallelism, checkpoints and bit-for-bit resume, model selection on validation, the final
test. Closed-form models: `fit` with validation for their own model selection, then the test.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from vaecf import checkpoint, distributed, footprint, graphs, memory, models, rundir
from vaecf import precision as prec
from vaecf.background import CheckpointWriter, snapshot
from vaecf.config import ANNEAL_SETTINGS, GRADIENT_SETTINGS, PATIENCE, TrainConfig, from_dict
from vaecf.data.matrix import CSR, prefetch_batches
from vaecf.data.prepare import PreparedDataset
from vaecf.errors import ConfigError, RunError
from vaecf.evaluate import evaluate_model, metrics_with
from vaecf.models import Model, Phase
from vaecf.runtime import tune_cpu_allocator
from vaecf.safewrite import atomic_file, write_json, writer_lock
from vaecf.settings import flag
from vaecf.specs import FORECAST_MARGIN, SPECS

# Settings a resumed run may change; every other one must match the run's own.
RESUME_MAY_CHANGE = (
    "epochs",
    "progress",
    "device",
    "data_on",
    "cuda_graphs",
    "eval_batch_size",
    "checkpoint_every",
    "patience",
    "budget",
)


class TrainingDiverged(RuntimeError):
    """The loss stopped being finite: the run cannot go on as configured."""


@dataclass
class RunResult:
    run_dir: Path
    best_epoch: int
    validation_metrics: dict
    test_metrics: dict
    history: list = field(default_factory=list)


def beta_at(step: int, cfg: TrainConfig) -> float:
    """KL weight of update `step` (0-based): min(anneal_cap, step / total_anneal_steps)."""
    if cfg.total_anneal_steps is None:  # a model without KL annealing
        return 0.0
    return min(cfg.anneal_cap, step / cfg.total_anneal_steps)


def make_optimizer(params, lr: float, device: torch.device):
    """Adam (the paper's); the fused single-kernel implementation on CPU and CUDA."""
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    return torch.optim.Adam(params, lr=lr, fused=device.type in ("cpu", "cuda"))


def _rng_state(gen: torch.Generator) -> dict:
    state = {"torch": torch.get_rng_state(), "shuffle": gen.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    gen.set_state(state["shuffle"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


load_run_config = rundir.load_config  # vaecf 0.1 name


def _leftover(path: Path) -> bool:
    """A temp file of an interrupted atomic write (vaecf.safewrite.atomic_file's `.NAME.*.tmp`)."""
    return path.is_file() and path.name.startswith(".") and path.name.endswith(".tmp")


def model_name_of(model_config) -> str:
    """Registry name of a config dataclass instance."""
    named = getattr(model_config, "model", None)  # a config shared by several models names one
    for name, spec in SPECS.items():
        if type(model_config) is spec.Config and named in (None, name):
            return name
    raise ConfigError(f"{type(model_config).__name__} is no model's config")


def resolve_config(cfg: TrainConfig, model_cls: type[Model], n_train_users: int) -> TrainConfig:
    """Refuse settings the model does not read; fill the unset ones from the model and data."""
    cfg.validate()
    unused = [
        n for n in (*GRADIENT_SETTINGS, *ANNEAL_SETTINGS) if n not in model_cls.train_settings
    ]
    given = [
        n
        for n in unused
        if getattr(cfg, n) not in (None, TrainConfig.__dataclass_fields__[n].default)
    ]
    if given:
        raise ConfigError(
            f"{', '.join(map(flag, given))} "
            f"{'does' if len(given) == 1 else 'do'} not apply to --model {model_cls.name}"
        )
    d = cfg.to_dict()
    d.update(model_cls.resolve_train(d, n_train_users, cfg.preset))
    if d["patience"] is None and "patience" in model_cls.train_settings:
        d["patience"] = 0 if cfg.preset == "paper" else PATIENCE
    return TrainConfig(**d)


def _resume_config(saved: dict, given: TrainConfig | None) -> TrainConfig:
    """The run's own settings; from `given`, only what a resume may change (else an error)."""
    config = from_dict(TrainConfig, saved)
    if given is None:
        return config
    defaults = TrainConfig()
    clash = [
        n
        for n in saved
        if hasattr(given, n)
        and n not in RESUME_MAY_CHANGE
        and getattr(given, n) not in (None, getattr(defaults, n), saved[n])
    ]
    if clash:
        raise RunError(
            "a resumed run keeps its settings; "
            + ", ".join(f"{flag(n)} {getattr(given, n)!r} (run: {saved[n]!r})" for n in clash)
            + f" conflict. A resume may change only {', '.join(RESUME_MAY_CHANGE)}; "
            "start a new --out to train with other settings"
        )
    for n in RESUME_MAY_CHANGE:
        v = getattr(given, n)
        if v is not None and v != getattr(defaults, n):
            setattr(config, n, v)
    config.progress = given.progress
    return config


def train(data, config, out, model_config=None, resume=False, model=None, on_epoch=None, test=True):
    """vaecf.training.train (`vaecf.train`) for one model (not `auto`)."""
    ds = data if isinstance(data, PreparedDataset) else PreparedDataset(data)
    out = Path(out)
    test = test and ds.manifest["counts"]["n_test_users"] > 0  # a production split has none
    if model is not None and not models.get(model).trainable:
        raise ConfigError(f"--model {model} is made by --model auto, not trained on its own")
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun rank 0 holds the lock
        return _train(ds, config, out, model_config, resume, model, on_epoch, test)
    with writer_lock(out, "vaecf train"):
        return _train(ds, config, out, model_config, resume, model, on_epoch, test)


def _train(ds, config, out, model_config, resume, model, on_epoch, test) -> RunResult:
    if resume and rundir.is_run(out):
        saved = rundir.load_config(out)
        if saved["data"]["fingerprint"] != ds.fingerprint:
            raise RunError(
                f"{out} was trained on another dataset "
                f"({saved['data']['path']}); pass that --data to resume"
            )
        name = saved["model"]["name"]
        if (model or name) != name or (
            model_config is not None and model_name_of(model_config) != name
        ):
            raise RunError(f"{out} holds a {name} run; a resume cannot change the model")
        config = _resume_config(saved["train"], config)
        model_config = models.config_from_dict(name, saved["model"]["config"])
        if getattr(model_config, "fold_in_rows", False) is None:  # a run from before the
            model_config.fold_in_rows = False  # setting trained on the training users alone
        for p in filter(_leftover, out.iterdir()):  # a write the kill interrupted
            p.unlink()
    elif rundir.is_run(out):
        raise RunError(
            f"{out} already holds a run; pass --resume (resume=True) to continue it or choose "
            "another --out (out=)"
        )
    elif out.exists() and any(not _leftover(p) for p in out.iterdir()):
        raise RunError(f"{out} exists and is not a run directory; choose another --out (out=)")
    else:
        if out.exists():  # what a process killed before its first config.json left behind
            for p in out.iterdir():
                p.unlink()
        name = model or (model_name_of(model_config) if model_config is not None else "multvae")
        if model_config is None:
            model_config = models.config_from_dict(name)
        elif model_name_of(model_config) != name:
            raise ConfigError(f"model {name!r} was given a {type(model_config).__name__}")
        config = resolve_config(
            config or TrainConfig(), models.get(name), ds.manifest["counts"]["n_train_users"]
        )
    config.validate()
    started = not torch.distributed.is_initialized()
    ctx, device = distributed.setup(config.device)
    try:
        if resume and ctx.enabled:
            held = ctx.gather(rundir.is_run(out))
            if not held[0] and any(held):
                raise RunError(
                    f"--resume: rank 0, which writes the run, is on a machine without {out} "
                    f"(rank {held.index(True)} has it); launch so that the machine holding it "
                    "gets rank 0 (torchrun's c10d rendezvous ranks machines by host name; "
                    "static rendezvous: --node-rank 0 there), or keep --out on a shared file "
                    "system"
                )
        # every rank trains rank 0's settings: on a resume the other nodes may not hold the run
        # directory that rank 0 read them from
        config, model_config, name = ctx.from_main((config, model_config, name))
        if ctx.enabled and config.batch_size and config.batch_size < ctx.world:
            raise ConfigError(
                f"--batch-size {config.batch_size} is below the {ctx.world} "
                "processes; it is the global batch, split across them"
            )
        trainer_cls = ClosedFormFit if models.get(name).closed_form else Trainer
        run = trainer_cls(ds, config, name, model_config, out, ctx, device)
        run.on_epoch = on_epoch
        run.score_test = test
        return run.fit()
    finally:
        if started:
            distributed.teardown()


class _Run:
    """What every fit shares: the device and precision, the data, the run directory."""

    def __init__(
        self,
        ds: PreparedDataset,
        cfg: TrainConfig,
        model_name: str,
        model_cfg,
        out: Path,
        ctx: distributed.DistContext | None = None,
        device: str | None = None,
    ):
        self.t_start = time.perf_counter()  # what --budget counts from
        self.new_dir = not Path(out).exists()  # a refused fit of a new run leaves nothing
        self.ds, self.cfg, self.model_name, self.model_cfg, self.out = (
            ds,
            cfg,
            model_name,
            model_cfg,
            out,
        )
        if getattr(model_cfg, "fold_in_rows", False) is None:  # resolved and recorded
            auto = cfg.preset == "auto" and models.get(model_name).fold_in_default
            model_cfg.fold_in_rows = bool(auto)
        self.ctx = ctx or distributed.DistContext()
        self.device = prec.resolve_device(device or cfg.device)
        if self.device.type == "cpu":
            tune_cpu_allocator()
        cfg.precision = prec.resolve_precision(cfg.precision, self.device)
        prec.check_precision(cfg.precision, self.device)
        self.val = (
            CSR.from_scipy(ds.split("validation_tr"), self.device),
            CSR.from_scipy(ds.split("validation_te"), self.device),
        )
        self._check_memory()
        torch.manual_seed(cfg.seed)
        self.model: Model = models.build(model_name, ds.n_items, model_cfg).to(self.device)
        self.best = {"epoch": 0, "value": -math.inf, "metrics": {}}
        self.history: list[dict] = []
        self.epoch, self.step = 0, 0
        self.on_epoch: Callable[[dict], None] | None = None
        self.score_test = True
        self.stopped: str | None = None  # why training ended: epochs, patience or budget

    def _check_memory(self) -> None:
        """Before the model is built: refuse what will not fit (closed-form models check
        inside their fit, where the solver is chosen)."""

    @contextlib.contextmanager
    def _discarded_if_it_fails(self) -> Iterator[None]:
        """A new run that fails before its first model is saved (a memory refusal, an error,
        an interruption) removes its directory: nothing half-made is left where the advised
        settings are to be tried (closed forms have nothing to resume; a gradient model's
        first checkpoint comes after its prepare)."""
        try:
            yield
        except BaseException:
            if self.new_dir and self.ctx.is_main:
                shutil.rmtree(self.out, ignore_errors=True)
            raise

    def _write_config(self) -> None:
        if not self.ctx.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        rundir.start_run(
            self.out,
            self.model_name,
            models.config_to_dict(self.model_cfg),
            self.cfg.to_dict(),
            self.ds,
        )

    def validate(self) -> dict:
        return self._evaluate(*self.val)

    def _evaluate(self, fold_in: CSR, target: CSR) -> dict:
        return evaluate_model(
            self.model,
            fold_in,
            target,
            metrics_with(self.cfg.select_metric),
            batch_size=self.cfg.eval_batch_size,
            precision=self.cfg.precision,
            dist=self.ctx,
        )

    def _finish(self, timing: dict | None = None, t_start: float | None = None) -> RunResult:
        """Score the test split with the selected model and write results.json (with the run's
        time budget, `timing`, where given)."""
        t0 = time.perf_counter()
        self.ctx.barrier()  # best.pt is written
        if self.ctx.is_main:
            ck = checkpoint.load(self.out / rundir.BEST, map_location=self.device)
            self.model.load_state_dict(ck["model"])
        if self.ctx.enabled:  # the other ranks need not see rank 0's filesystem
            for t in self.model.state_dict().values():
                torch.distributed.broadcast(t, 0)
        test_metrics = None
        if self.score_test:
            test_metrics = self._evaluate(
                CSR.from_scipy(self.ds.split("test_tr"), self.device),
                CSR.from_scipy(self.ds.split("test_te"), self.device),
            )
        results = {
            "model": self.model_name,
            "best_epoch": self.best["epoch"],
            "validation": self.best["metrics"],
            "test": test_metrics,
            "epochs": self.epoch,
            "steps": self.step,
        }
        if self.stopped is not None:
            results["stopped"] = self.stopped
        if hasattr(self, "train_csr"):  # gradient models: the rows trained on
            results["train_rows"] = self.train_csr.n_rows
        if timing is not None:
            timing["test_s"] = time.perf_counter() - t0
            timing["total_s"] = time.perf_counter() - (t_start or t0)
            results["timing"] = {k: round(v, 4) for k, v in timing.items()}
        if self.ctx.is_main:
            write_json(self.out / rundir.RESULTS, results)
        self.ctx.barrier()
        return RunResult(
            self.out, results["best_epoch"], results["validation"], results["test"], self.history
        )

    def _finished(self) -> bool:
        """results.json exists and is this state's (not a shorter run's, before an extension);
        rank 0's answer on every rank."""
        done = False
        if self.ctx.is_main and (self.out / rundir.RESULTS).is_file():
            try:
                done = rundir.load_results(self.out).get("epochs") == self.epoch
            except RunError:
                pass
        return self.ctx.from_main(done)

    def _result(self) -> RunResult:
        res = self.ctx.from_main(rundir.load_results(self.out) if self.ctx.is_main else None)
        return RunResult(self.out, res["best_epoch"], res["validation"], res["test"], self.history)


class ClosedFormFit(_Run):
    """EASE, popularity: one fit (with its own validation-based choices), then the test."""

    def fit(self) -> RunResult:
        if (self.out / rundir.RESULTS).is_file():
            return self._result()
        with self._discarded_if_it_fails():
            return self._fit_once()

    def _fit_once(self) -> RunResult:
        self._write_config()
        show = self.cfg.progress and self.ctx.is_main
        t0 = time.perf_counter()
        budget = {} if self.cfg.budget is None else {"deadline": self.t_start + self.cfg.budget}
        record = self.model.fit(
            self.ds.split("train"),
            validate=lambda m: self.validate(),
            validation=(self.ds.split("validation_tr"), self.ds.split("validation_te")),
            fold_in=sp.vstack([self.ds.split("validation_tr"), self.ds.split("test_tr")]).tocsr(),
            select_metric=self.cfg.select_metric,
            log=tqdm.write if show else None,
            **budget,  # only under a --budget: a model of the contract may not take it
        )
        self.stopped = record.get("stopped")
        val = self.validate()
        self.epoch = 1
        self.best = {"epoch": 1, "value": val[self.cfg.select_metric], "metrics": val}
        row = {"epoch": 1, "fit_seconds": round(time.perf_counter() - t0, 3), **record}
        row["validation"] = val
        self.history = [row]
        if self.ctx.is_main:
            rundir.save_model(self.out, self.model, epoch=1, metrics=val)
            with atomic_file(self.out / rundir.METRICS, "w") as f:
                f.write(json.dumps(row) + "\n")
        if self.on_epoch is not None:
            self.on_epoch(row)
        return self._finish()


class Trainer(_Run):
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
        self.step_module: torch.nn.Module = _LossModule(self.model)  # DDP-wrapped in fit()
        self._best_state: dict | None = None  # a best model not yet written to best.pt
        # each phase's graph by its name; False: no graphs; None: not yet decided
        self._graph: dict[str, graphs.GraphedStep] | bool | None = None
        self.graph_steps = 0  # steps of this process replayed as a CUDA graph
        self._val_seconds = 0.0  # the last validation's time, for the budget's forecast

    def _train_rows(self) -> sp.csr_matrix:
        """What the model trains on: the training users' rows, and with the model's
        `fold_in_rows` the held-out users' fold-in rows after them (never their targets)."""
        train = self.ds.split("train")
        if not getattr(self.model_cfg, "fold_in_rows", False):
            return train
        parts = [train, self.ds.split("validation_tr"), self.ds.split("test_tr")]
        return sp.vstack(parts).tocsr()

    def _check_memory(self) -> None:
        """What training will hold (weights, gradients, Adam, a batch, the data, checkpoint
        copies), stated, and refused with the figures before anything large is allocated;
        where the background checkpoints' copies do not fit, last.pt is written in the
        foreground (see vaecf.memory)."""
        cfg, ds = self.cfg, self.ds
        counts = ds.manifest["counts"]
        fold_in = getattr(self.model_cfg, "fold_in_rows", False)
        # a step's users: the batch (at most every training user), split across the processes
        batch = min(cfg.batch_size, max(counts.get("n_train_users", 0), 1))
        batch = -(-batch // self.ctx.world) if self.ctx.enabled else batch
        mem = footprint.train_memory(
            self.model_name,
            ds.n_items,
            self.model_cfg,
            batch,
            cfg.precision,
            counts.get("nnz_train", 0)
            + sum(counts.get(f"nnz_{k}_tr", 0) for k in ("validation", "test") if fold_in),
            ddp=self.ctx.enabled,
        )
        title = models.get(self.model_name).title
        refused = plan = None
        try:
            self.background_checkpoints, plan = footprint.check_train_memory(
                mem,
                self.device,
                title,
                batch,
                lambda: self._train_rows().getnnz(axis=0),
                memory.local_processes() if self.ctx.enabled else 1,
                self.ctx.world if self.ctx.enabled else 1,
            )
        except RunError as e:
            refused = str(e)
        if self.ctx.enabled:  # every rank stops if one machine cannot hold it (none waits)
            said = self.ctx.gather(refused)
            refused = refused or next((f"rank {i}: {m}" for i, m in enumerate(said) if m), None)
        if refused:
            raise RunError(refused)
        if cfg.progress and self.ctx.is_main:
            tqdm.write(plan)

    # -- run directory ------------------------------------------------------------------------
    def _save_last(self) -> None:
        """Queue last.pt (a snapshot of everything a resume needs) for the background writer,
        after making the metrics lines it covers durable, and before it best.pt if the best
        model changed since the last checkpoint. best.pt is written only here, so it always
        holds the best model that last.pt records: a kill loses a newer best together with
        the epochs that found it, and the resumed run finds it again."""
        self._last_saved = time.perf_counter()
        if not self.ctx.is_main:
            return
        self.writer.flush()  # the last save's copies are written and freed before new ones
        if self._best_state is not None:
            self.writer.submit(self.out / rundir.BEST, self._best_state)
            self._best_state = None
        self._metrics_file.flush()
        os.fsync(self._metrics_file.fileno())
        state = {
            "model": self.model.state_dict(),
            "optimizer": {k: o.state_dict() for k, o in self.opts.items()},
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "step": self.step,
            "best": self.best,
            "history": self.history,
            "rng": _rng_state(self.gen),
        }
        if self.background_checkpoints:
            self.writer.submit(self.out / rundir.LAST, snapshot(state))
        else:  # no memory for a copy: written from the live tensors while training waits
            self.writer.write_now(self.out / rundir.LAST, state)

    def _open_metrics(self) -> None:
        """metrics.jsonl holds exactly the epochs of the state trained from (after a kill it may
        run ahead of last.pt: those lines are dropped), then is appended to."""
        path = self.out / rundir.METRICS
        if self.ctx.is_main:
            lines = path.read_text().splitlines() if path.is_file() else []
            if lines != [json.dumps(row) for row in self.history]:  # ahead, or a torn line
                with atomic_file(path, "w") as f:
                    f.writelines(json.dumps(row) + "\n" for row in self.history)
            self._metrics_file = open(path, "a")  # noqa: SIM115 (closed in fit)

    def _read_last(self) -> dict | None:
        """last.pt's state if the run has one; under torchrun rank 0's, sent to every rank (a
        node other than rank 0's needs only its copy of the prepared data, not the run
        directory). A finished run whose last.pt was removed is refused: starting over would
        overwrite its model."""
        ck, error = None, None
        if self.ctx.is_main:
            if (self.out / rundir.LAST).is_file():
                try:
                    ck = checkpoint.load(self.out / rundir.LAST, map_location="cpu")
                except RunError as e:
                    error = str(e)
            elif (self.out / rundir.BEST).is_file() and (self.out / rundir.RESULTS).is_file():
                # (a best.pt without last.pt or results.json is one whose last.pt write was cut
                # short, by a kill or a full disk: training from the start finds it again)
                error = (
                    f"{self.out} has a {rundir.BEST} but no {rundir.LAST} to continue from "
                    "(vaecf tune keeps only best.pt of finished and pruned trials); train a new "
                    f"run with its settings: vaecf train --config "
                    f"{self.out / rundir.CONFIG_TOML} --out NEW"
                )
        ck, error = self.ctx.from_main((ck, error))
        if error:
            raise RunError(error)
        return ck

    def _load_last(self, ck: dict) -> None:
        self.model.load_state_dict(ck["model"])
        opt_state = ck["optimizer"]
        if "state" in opt_state:  # vaecf 0.1: one optimizer
            opt_state = {"all": opt_state}
        for k, o in self.opts.items():
            o.load_state_dict(opt_state[k])
            for g in o.param_groups:  # as saved by a run with CUDA graphs, which set it
                g["capturable"] = False
        self.scaler.load_state_dict(ck["scaler"])
        self.epoch, self.step = ck["epoch"], ck["step"]
        self.best, self.history = ck["best"], ck["history"]
        _set_rng_state(ck["rng"], self.gen)

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
        seconds = time.perf_counter() - t0
        users = totals[3].item() or 1.0
        nll, kl, term = (totals[:3] / users).tolist()
        passes = sum(p.passes for p in self.model.phases())
        return {
            "loss": nll + term,
            "nll": nll,
            "kl": kl,
            "beta": beta_at(self.step - 1, cfg),
            "train_seconds": round(seconds, 4),
            "users_per_s": round(n * passes / seconds, 1),
        }

    def _graphed(self, phase: Phase):
        """The phase's full-batch step as a CUDA graph, captured at the phase's first use (after
        a resume has loaded its state: the graph holds the parameters and Adam's state
        tensors), or None where graphs do not apply (`graphs.graphs_apply`)."""
        if self._graph is None:  # decided once for the run
            cfg = self.cfg
            why = graphs.graphs_apply(
                self.model, self.device, cfg.precision, self.ctx.world, cfg.cuda_graphs, cfg.data_on
            )
            # what is still to come: a step's activations and gradients for each phase's graph
            # and again for the eager steps (the epoch's last), and Adam's moments (a fresh run's)
            params = sum(p.numel() for p in self.model.parameters())
            steps = 1 + len(self.model.phases())
            batch = footprint.ACTIVATION_BYTES * cfg.batch_size * self.ds.n_items
            need = steps * batch + 16 * params
            if why is None and memory.available_bytes(self.device) < need:
                why = f"the GPU has less than {memory.gib(need)} free for a graph's step"
                if cfg.progress and self.ctx.is_main:
                    tqdm.write(f"CUDA graphs off: {why}; each step runs eagerly")
            if why is not None:
                self._graph = False
            else:
                self._graph = {}
                self._row_nnz = self.train_csr.row_nnz().cpu()
                self._capacity = graphs.graph_capacity(self._row_nnz.numpy(), cfg.batch_size)
                if cfg.progress and self.ctx.is_main:
                    tqdm.write(
                        f"CUDA graphs: each full batch's step replayed as one graph (up to "
                        f"{self._capacity:,} interactions a batch; --cuda-graphs false: eager "
                        "steps)"
                    )
        if self._graph is False:
            return None
        if phase.name not in self._graph:
            self._graph[phase.name] = graphs.GraphedStep(
                self.model,
                [self.opts[g] for g in phase.groups],
                self.train_csr,
                self.cfg.batch_size,
                self.cfg.precision,
                self._capacity,
                phase,
            )
        return self._graph[phase.name]

    def _run_phases(self, totals: torch.Tensor) -> None:
        cfg, ctx, n = self.cfg, self.ctx, self.train_csr.n_rows
        for phase in self.model.phases():
            self.model.begin_phase(phase)
            opts = [self.opts[g] for g in phase.groups]
            graph = self._graphed(phase)
            for _ in range(phase.passes):
                perm = torch.randperm(n, generator=self.gen)  # the same on every rank
                steps = self._graph_steps(graph, perm) if graph else self._batches(perm)
                for rows, batch in steps:
                    beta = beta_at(self.step, cfg)
                    if batch is None:  # a full batch that fits: the graph's step
                        parts = graph(rows, beta)
                        self.graph_steps += 1
                    else:
                        parts = self._eager_step(batch, beta, rows.numel() / ctx.world, phase, opts)
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

    def _graph_steps(self, graph: graphs.GraphedStep, perm: torch.Tensor):
        """(rows on the device, None) for the full batches whose non-zeros fit the graph (their
        totals read from a host copy of the row lengths: nothing waits on the GPU), (rows,
        batch) for the others (the last, smaller batch), which run eagerly."""
        size = self.cfg.batch_size
        lens = self._row_nnz[perm].split(size)
        for rows, ln in zip(perm.to(self.device).split(size), lens):
            if rows.numel() == size and graph.fits(int(ln.sum())):
                yield rows, None
            else:
                yield rows, self.train_csr.batch(rows)

    def fit(self) -> RunResult:
        cfg = self.cfg
        t_setup = time.perf_counter()
        ck = self._read_last()
        if ck is not None:
            self._load_last(ck)
        self._write_config()
        if self._done() is not None and self._finished():
            return self._result()
        if self.epoch == 0:  # a new run: the model's data-dependent parts, if it has any
            val = (self.ds.split("validation_tr"), self.ds.split("validation_te"))
            with self._discarded_if_it_fails():
                prepared = self.model.prepare(self._train_rows(), val)
            if prepared and cfg.progress and self.ctx.is_main:
                tqdm.write(
                    f"{self.model.title}: " + ", ".join(f"{k} {v:g}" for k, v in prepared.items())
                )
            if self.model.config != self.model_cfg:  # what prepare chose: on the card
                self.model_cfg = self.model.config
                self._write_config()
        if self._done() is None and self.ctx.is_main:  # extending a finished run: its
            (self.out / rundir.RESULTS).unlink(missing_ok=True)  # results are no longer the run's
        if self.ctx.enabled:
            self._wrap_data_parallel()
        self.writer = CheckpointWriter()
        self._open_metrics()
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
        self._last_saved = time.perf_counter()
        deadline = None if cfg.budget is None else self.t_start + cfg.budget
        stop = _StopRequests(enabled=not self.ctx.enabled)
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
            self.writer.flush()  # best.pt and last.pt are on disk before the test
            timing["checkpoint_wait_s"] = self.writer.wait_seconds
        finally:
            bar.close()
            if self.ctx.is_main:
                self._metrics_file.close()
            self.writer.close()
        timing["checkpoint_bytes"] = self.writer.bytes_written
        timing["checkpoint_writes"] = self.writer.writes
        timing["graph_steps"] = self.graph_steps
        return self._finish(timing, t_setup)

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
        if patience and self.best["epoch"] and self.epoch - self.best["epoch"] >= patience:
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
                "continue with --resume (resume=True)"
            )
        return "budget" if over and self._done() is None else None

    def _stop_line(self) -> str:
        best, metric = self.best["epoch"], self.cfg.select_metric
        if self.stopped == "patience":
            why = f"no better validation {metric} in {self.cfg.patience} epochs"
        else:
            why = f"another epoch would end past the {self.cfg.budget:g} s budget"
        return f"stopped after epoch {self.epoch}: {why}; the best, epoch {best}, is kept"

    def _validate_epoch(self, row: dict, show: bool) -> None:
        cfg = self.cfg
        val = self.validate()
        row["validation"] = val
        if val[cfg.select_metric] > self.best["value"]:
            self.best = {"epoch": self.epoch, "value": val[cfg.select_metric], "metrics": val}
            if self.ctx.is_main:  # written with the next last.pt (see _save_last)
                state = {"model": self.model.state_dict(), "epoch": self.epoch, "metrics": val}
                self._best_state = snapshot(state)
        if show:
            tqdm.write(_epoch_line(row, cfg.select_metric, self.best["epoch"] == self.epoch))


class _StopRequests:
    """SIGINT/SIGTERM during training: the first asks to stop after the current epoch (with a
    checkpoint); a second SIGINT interrupts at once. Only in the main thread of a single
    process (data-parallel ranks keep the default handlers)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        tqdm.write(
            f"{signal.Signals(signum).name}: stopping after this epoch with a checkpoint "
            "(Ctrl-C again to stop at once)"
        )

    def __enter__(self):
        if self.enabled:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _LossModule(torch.nn.Module):
    """The model's loss as a forward(), so DDP can wrap the training step."""

    def __init__(self, model: Model):
        super().__init__()
        self.model = model

    def forward(self, batch, beta: float, denom: float, phase: Phase):
        return self.model.loss(batch, beta, denom, phase)


def _epoch_line(row: dict, metric: str, is_best: bool) -> str:
    val = row["validation"]
    shown = "  ".join(
        f"{k} {val[k]:.4f}" for k in ("recall@20", "recall@50", "ndcg@100") if k in val
    )
    return (
        f"epoch {row['epoch']:4d}  loss {row['loss']:9.3f}  {shown}"
        f"  {row['users_per_s']:8.0f} users/s{'  *' if is_best else ''}"
    )
