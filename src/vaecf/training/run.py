"""What every fit of a model shares (`Run`: the device and precision, the data, the run
directory, validation, the final test and results.json), and the closed-form fit
(`ClosedFormFit`: one `fit` with the model's own validation-based choices, then the test). The
gradient models' fit is gradient's `GradientFit`; single chooses between them.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from vaecf import distributed, models, rundir
from vaecf import precision as prec
from vaecf.config.train import TrainConfig
from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.data.preprocess import TIME_PROTOCOLS
from vaecf.errors import RunError
from vaecf.evaluate import evaluate_model, metrics_with
from vaecf.models import Model
from vaecf.runtime import tune_cpu_allocator
from vaecf.storage import checkpoint
from vaecf.storage.safewrite import atomic_file, write_json


@dataclass
class RunResult:
    run_dir: Path
    best_epoch: int | None  # None for a closed form, fitted once
    validation_metrics: dict
    test_metrics: dict
    history: list = field(default_factory=list)


class Run:
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
        if (
            hasattr(model_cfg, "fold_in_rows")
            and ds.manifest["settings"]["protocol"] in TIME_PROTOCOLS
        ):
            # a held-out user's history under a time protocol is their past up to a later
            # period (the test history holds the validation period): never a training row
            model_cfg.fold_in_rows = False
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
        self.check_memory()
        torch.manual_seed(cfg.seed)
        self.model: Model = models.build(model_name, ds.n_items, model_cfg).to(self.device)
        self.best = {"epoch": 0, "value": -math.inf, "metrics": {}}
        self.history: list[dict] = []
        self.epoch, self.step = 0, 0
        self.on_epoch: Callable[[dict], None] | None = None
        self.score_test = True
        self.stopped: str | None = None  # why training ended: epochs, patience or budget
        self.facts: dict = {}  # what the fit chose for itself, recorded in results.json

    @property
    def deadline(self) -> float | None:
        """The `time.perf_counter()` value at which the run's --budget ends (None: no budget),
        counted from the run's start; the one place it is computed, for the closed-form fit and
        the gradient loop alike."""
        return None if self.cfg.budget is None else self.t_start + self.cfg.budget

    def check_memory(self) -> None:
        """Before the model is built: refuse what will not fit (closed-form models check
        inside their fit, where the solver is chosen)."""

    @contextlib.contextmanager
    def discarded_if_it_fails(self) -> Iterator[None]:
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

    def write_config(self) -> None:
        """config.json and config.toml (rank 0)."""
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

    def finish(
        self,
        timing: dict | None = None,
        t_start: float | None = None,
        weights: dict | None = None,
        written: Callable[[], None] | None = None,
    ) -> RunResult:
        """Score the test split with the selected model and write results.json (with the run's
        time budget, `timing`, where given). `weights`: the selected model's state dict where
        the caller holds it (else best.pt's); `written`: called before results.json is, to wait
        for checkpoints still being written (the test runs meanwhile)."""
        t0 = time.perf_counter()
        self.ctx.barrier()  # best.pt is written, or its weights are in `weights`
        if self.ctx.is_main:
            if weights is None:
                weights = checkpoint.load(self.out / rundir.BEST, map_location=self.device)["model"]
            self.model.load_state_dict(weights)
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
        results.update(self.facts)
        if hasattr(self, "train_csr"):  # gradient models: the rows trained on
            results["train_rows"] = self.train_csr.n_rows
        if timing is not None:
            timing["test_s"] = time.perf_counter() - t0
        if written is not None:
            written()
        if timing is not None:
            timing["total_s"] = time.perf_counter() - (t_start or t0)
            results["timing"] = {k: round(v, 4) for k, v in timing.items()}
        if self.ctx.is_main:
            write_json(self.out / rundir.RESULTS, results)
        self.ctx.barrier()
        return RunResult(
            self.out, results["best_epoch"], results["validation"], results["test"], self.history
        )

    def finished(self) -> bool:
        """results.json exists and is this state's (not a shorter run's, before an extension);
        rank 0's answer on every rank."""
        done = False
        if self.ctx.is_main and (self.out / rundir.RESULTS).is_file():
            try:
                done = rundir.load_results(self.out).get("epochs") == self.epoch
            except RunError:
                pass
        return self.ctx.from_main(done)

    def result(self) -> RunResult:
        """The finished run's result, read from its results.json (rank 0's, on every rank)."""
        res = self.ctx.from_main(rundir.load_results(self.out) if self.ctx.is_main else None)
        return RunResult(self.out, res["best_epoch"], res["validation"], res["test"], self.history)


class ClosedFormFit(Run):
    """EASE, popularity: one fit (with its own validation-based choices), then the test."""

    def fit(self) -> RunResult:
        if (self.out / rundir.RESULTS).is_file():
            return self.result()
        with self.discarded_if_it_fails():
            return self._fit_once()

    def _fit_once(self) -> RunResult:
        self.write_config()
        show = self.cfg.progress and self.ctx.is_main
        t0 = time.perf_counter()
        budget = {} if self.deadline is None else {"deadline": self.deadline}
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
        # fitted once: no best epoch (results.json's best_epoch is null, as the card shows it)
        self.best = {"epoch": None, "value": val[self.cfg.select_metric], "metrics": val}
        row = {"epoch": 1, "fit_seconds": round(time.perf_counter() - t0, 3), **record}
        row["validation"] = val
        self.history = [row]
        # best.pt and metrics.jsonl written on a thread while the test runs (the weights do
        # not change), on disk before results.json; leaving the block waits for them anyway
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(self._write_fit, val, row) if self.ctx.is_main else None
            if self.on_epoch is not None:
                self.on_epoch(row)
            return self.finish(weights=self.model.state_dict(), written=done and done.result)

    def _write_fit(self, val: dict, row: dict) -> None:
        if (rows := getattr(self.model, "gram_rows", None)) is not None:
            rundir.save_rows(self.out, rows)  # for the next update (EASE)
        rundir.save_model(self.out, self.model, epoch=1, metrics=val)
        with atomic_file(self.out / rundir.METRICS, "w") as f:
            f.write(json.dumps(row) + "\n")
