"""Trainer: epoch loop, KL annealing, precision, checkpoints, model selection, final test.

Run directory: config.json (resolved settings), items.parquet (the item vocabulary), last.pt
(everything needed to resume bit-for-bit), best.pt (weights with the best validation metric),
metrics.jsonl (one line per epoch), results.json (best epoch, its validation and test metrics).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from vaecf import checkpoint, distributed
from vaecf import precision as prec
from vaecf._io import atomic_file, write_json
from vaecf.config import TrainConfig, from_dict
from vaecf.data.matrix import CSR, prefetch_batches
from vaecf.data.prepare import PreparedDataset
from vaecf.errors import RunError
from vaecf.evaluate import evaluate_model
from vaecf.models.multvae import ModelConfig, MultAE, build_model
from vaecf.runtime import tune_cpu_allocator


@dataclass
class RunResult:
    run_dir: Path
    best_epoch: int
    validation_metrics: dict
    test_metrics: dict
    history: list = field(default_factory=list)


def beta_at(step: int, cfg: TrainConfig) -> float:
    """KL weight of update `step` (0-based): min(anneal_cap, step / total_anneal_steps)."""
    return min(cfg.anneal_cap, step / cfg.total_anneal_steps)


def make_optimizer(model: torch.nn.Module, lr: float, device: torch.device):
    """Adam (the paper's); the fused single-kernel implementation on CPU and CUDA."""
    return torch.optim.Adam(model.parameters(), lr=lr, fused=device.type in ("cpu", "cuda"))


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


def _is_run(path: Path) -> bool:
    return (path / "config.json").is_file()


def load_run_config(run_dir: str | os.PathLike) -> dict:
    run_dir = Path(run_dir)
    if not _is_run(run_dir):
        raise RunError(
            f"{run_dir} is not a vaecf run directory (no config.json); "
            "pass the --out directory of `vaecf train`"
        )
    try:
        return json.loads((run_dir / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise RunError(f"{run_dir}/config.json is corrupted ({e})") from None


def train(
    data: PreparedDataset | str | os.PathLike,
    config: TrainConfig | None = None,
    out: str | os.PathLike = "runs/run",
    model_config: ModelConfig | None = None,
    resume: bool = False,
) -> RunResult:
    """Train on a prepared dataset into run directory `out`; `resume=True` continues it."""
    ds = data if isinstance(data, PreparedDataset) else PreparedDataset(data)
    out = Path(out)
    if resume and _is_run(out):
        saved = load_run_config(out)
        if saved["data"]["fingerprint"] != ds.fingerprint:
            raise RunError(
                f"{out} was trained on another dataset "
                f"({saved['data']['path']}); pass that --data to resume"
            )
        epochs = config.epochs if config is not None else None
        config = from_dict(TrainConfig, saved["train"])
        if epochs is not None:
            config.epochs = epochs  # the one setting a resume may change: train longer
        model_config = from_dict(ModelConfig, saved["model"])
    elif _is_run(out):
        raise RunError(
            f"{out} already holds a run; pass --resume to continue it or choose another --out"
        )
    elif out.exists() and any(out.iterdir()):
        raise RunError(f"{out} exists and is not a run directory; choose another --out")
    config = config or TrainConfig()
    model_config = model_config or ModelConfig()
    config.validate()
    started = not torch.distributed.is_initialized()
    ctx, device = distributed.setup(config.device)
    try:
        if ctx.enabled and config.batch_size < ctx.world:
            raise ValueError(
                f"--batch-size {config.batch_size} is below the {ctx.world} "
                "processes; it is the global batch, split across them"
            )
        return Trainer(ds, config, model_config, out, ctx, device).fit()
    finally:
        if started:
            distributed.teardown()


class Trainer:
    def __init__(
        self,
        ds: PreparedDataset,
        cfg: TrainConfig,
        model_cfg: ModelConfig,
        out: Path,
        ctx: distributed.DistContext | None = None,
        device: str | None = None,
    ):
        self.ds, self.cfg, self.model_cfg, self.out = ds, cfg, model_cfg, out
        self.ctx = ctx or distributed.DistContext()
        self.device = prec.resolve_device(device or cfg.device)
        if self.device.type == "cpu":
            tune_cpu_allocator()
        cfg.precision = prec.resolve_precision(cfg.precision, self.device)
        prec.check_precision(cfg.precision, self.device)
        prec.set_matmul_precision(cfg.precision)
        host = cfg.data_on == "host"
        self.train_csr = CSR.from_scipy(ds.split("train"), "cpu" if host else self.device)
        self.val = (
            CSR.from_scipy(ds.split("validation_tr"), self.device),
            CSR.from_scipy(ds.split("validation_te"), self.device),
        )
        torch.manual_seed(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.model: MultAE = build_model(ds.n_items, model_cfg).to(self.device)
        self.opt = make_optimizer(self.model, cfg.lr, self.device)
        self.scaler = prec.grad_scaler(self.device, cfg.precision)
        self.step_module: torch.nn.Module = _LossModule(self.model)  # DDP-wrapped in fit()
        self.epoch, self.step = 0, 0
        self.best = {"epoch": 0, "value": -math.inf, "metrics": {}}
        self.history: list[dict] = []

    # -- run directory ------------------------------------------------------------------------
    def _write_config(self) -> None:
        if not self.ctx.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(
            self.out / "config.json",
            {
                "model": asdict(self.model_cfg),
                "train": self.cfg.to_dict(),
                "data": {
                    "path": str(self.ds.path.resolve()),
                    "fingerprint": self.ds.fingerprint,
                    "n_items": self.ds.n_items,
                },
                "vaecf_version": self.ds.manifest.get("vaecf_version"),
            },
        )
        shutil.copyfile(self.ds.path / "items.parquet", self.out / ".items.parquet.tmp")
        os.replace(self.out / ".items.parquet.tmp", self.out / "items.parquet")

    def _save_last(self) -> None:
        if not self.ctx.is_main:
            return
        checkpoint.save(
            self.out / "last.pt",
            {
                "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(),
                "scaler": self.scaler.state_dict(),
                "epoch": self.epoch,
                "step": self.step,
                "best": self.best,
                "history": self.history,
                "rng": _rng_state(self.gen),
            },
        )
        with atomic_file(self.out / "metrics.jsonl", "w") as f:
            for row in self.history:
                f.write(json.dumps(row) + "\n")

    def _load_last(self) -> None:
        ck = checkpoint.load(self.out / "last.pt", map_location=self.device)
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        self.scaler.load_state_dict(ck["scaler"])
        self.epoch, self.step = ck["epoch"], ck["step"]
        self.best, self.history = ck["best"], ck["history"]
        _set_rng_state(ck["rng"], self.gen)

    # -- training -----------------------------------------------------------------------------
    def train_epoch(self) -> dict:
        self.model.train()
        cfg, ctx, n = self.cfg, self.ctx, self.train_csr.n_rows
        perm = torch.randperm(n, generator=self.gen)  # the same on every rank
        if cfg.data_on == "device":
            perm = perm.to(self.device)
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)  # NLL, KL sums
        t0 = time.perf_counter()
        global_rows = perm.split(cfg.batch_size)
        shards = [ctx.shard(rows) for rows in global_rows]
        if cfg.data_on == "host":
            batches = prefetch_batches(self.train_csr, shards, self.device)
        else:
            batches = (self.train_csr.batch(rows) for rows in shards)
        for rows, batch in zip(global_rows, batches):
            beta = beta_at(self.step, cfg)
            with prec.autocast(self.device, cfg.precision):
                loss, parts = self.step_module(batch, beta, rows.numel() / ctx.world)
            self.opt.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
            self.step += 1
            totals[0] += parts["nll_sum"]
            if "kl_sum" in parts:
                totals[1] += parts["kl_sum"]
        ctx.all_reduce_sum(totals)
        seconds = time.perf_counter() - t0
        nll, kl = (totals / n).tolist()
        beta = beta_at(self.step - 1, cfg)
        return {
            "loss": nll + beta * kl,
            "nll": nll,
            "kl": kl,
            "beta": beta,
            "train_seconds": round(seconds, 4),
            "users_per_s": round(n / seconds, 1),
        }

    def validate(self) -> dict:
        return evaluate_model(
            self.model,
            *self.val,
            batch_size=self.cfg.eval_batch_size,
            precision=self.cfg.precision,
            dist=self.ctx,
        )

    def fit(self) -> RunResult:
        cfg = self.cfg
        if (self.out / "last.pt").is_file():
            self._load_last()
        self._write_config()
        if self.epoch >= cfg.epochs and (self.out / "results.json").is_file():
            return self._result()
        if self.ctx.enabled:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.step_module = DistributedDataParallel(self.step_module, device_ids=ids)
        show = cfg.progress and self.ctx.is_main
        bar = tqdm(
            total=cfg.epochs,
            initial=self.epoch,
            desc="train",
            unit="epoch",
            disable=not show,
            dynamic_ncols=True,
        )
        try:
            while self.epoch < cfg.epochs:
                row = {"epoch": self.epoch + 1, "step": None, **self.train_epoch()}
                self.epoch += 1
                row["step"] = self.step
                if not math.isfinite(row["loss"]):
                    raise RuntimeError(
                        f"loss became {row['loss']} at epoch {self.epoch}; "
                        "lower --lr or use --precision fp32"
                    )
                if self.epoch % cfg.eval_every == 0 or self.epoch == cfg.epochs:
                    val = self.validate()
                    row["validation"] = val
                    if val[cfg.select_metric] > self.best["value"]:
                        self.best = {
                            "epoch": self.epoch,
                            "value": val[cfg.select_metric],
                            "metrics": val,
                        }
                        if self.ctx.is_main:
                            checkpoint.save(
                                self.out / "best.pt",
                                {
                                    "model": self.model.state_dict(),
                                    "epoch": self.epoch,
                                    "metrics": val,
                                },
                            )
                    if show:
                        tqdm.write(
                            _epoch_line(row, cfg.select_metric, self.best["epoch"] == self.epoch)
                        )
                self.history.append(row)
                self._save_last()
                bar.update(1)
                bar.set_postfix(
                    loss=f"{row['loss']:.2f}", best=f"{self.best['value']:.4f}@{self.best['epoch']}"
                )
        finally:
            bar.close()
        return self._finish()

    def _finish(self) -> RunResult:
        self.ctx.barrier()  # best.pt is written
        if self.ctx.is_main:
            ck = checkpoint.load(self.out / "best.pt", map_location=self.device)
            self.model.load_state_dict(ck["model"])
        if self.ctx.enabled:  # the other ranks need not see rank 0's filesystem
            for t in self.model.state_dict().values():
                torch.distributed.broadcast(t, 0)
        test = (
            CSR.from_scipy(self.ds.split("test_tr"), self.device),
            CSR.from_scipy(self.ds.split("test_te"), self.device),
        )
        test_metrics = evaluate_model(
            self.model,
            *test,
            batch_size=self.cfg.eval_batch_size,
            precision=self.cfg.precision,
            dist=self.ctx,
        )
        results = {
            "best_epoch": self.best["epoch"],
            "validation": self.best["metrics"],
            "test": test_metrics,
            "epochs": self.epoch,
            "steps": self.step,
        }
        if self.ctx.is_main:
            write_json(self.out / "results.json", results)
        self.ctx.barrier()
        return RunResult(
            self.out, results["best_epoch"], results["validation"], results["test"], self.history
        )

    def _result(self) -> RunResult:
        res = json.loads((self.out / "results.json").read_text())
        return RunResult(self.out, res["best_epoch"], res["validation"], res["test"], self.history)


class _LossModule(torch.nn.Module):
    """The model's loss as a forward(), so DDP can wrap the training step."""

    def __init__(self, model: MultAE):
        super().__init__()
        self.model = model

    def forward(self, batch, beta: float, denom: float):
        return self.model.loss(batch, beta, denom)


def _epoch_line(row: dict, metric: str, is_best: bool) -> str:
    val = row["validation"]
    shown = "  ".join(
        f"{k} {val[k]:.4f}" for k in ("recall@20", "recall@50", "ndcg@100") if k in val
    )
    return (
        f"epoch {row['epoch']:4d}  loss {row['loss']:9.3f}  {shown}"
        f"  {row['users_per_s']:8.0f} users/s{'  *' if is_best else ''}"
    )
