"""vaecf.train for one model: its settings resolved (or, on a resume, the run's own, checked
against what was given), the run directory claimed, then the fit: run's `ClosedFormFit`
for closed-form models, gradient's `GradientFit` for gradient models (epochs, precision, data
parallelism, checkpoints and bit-for-bit resume). The names other modules take from the fit
are here too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from vaecf import distributed, models, rundir
from vaecf.config.settings import spelled
from vaecf.config.specs import SPECS
from vaecf.config.train import (
    ANNEAL_SETTINGS,
    GRADIENT_SETTINGS,
    TrainConfig,
    auto_patience,
    from_dict,
)
from vaecf.data.prepare import PreparedDataset
from vaecf.errors import ConfigError, RunError, TrainingDiverged
from vaecf.models import Model
from vaecf.models.base import make_optimizer
from vaecf.storage.writelock import writer_lock
from vaecf.training.gradient import GradientFit
from vaecf.training.run import ClosedFormFit, RunResult

__all__ = [
    "RESUME_MAY_CHANGE",
    "ClosedFormFit",
    "RunResult",
    "GradientFit",
    "TrainingDiverged",
    "load_run_config",
    "make_optimizer",
    "model_name_of",
    "resolve_config",
    "train",
]

# Settings a resumed run may change; every other one must match the run's own.
RESUME_MAY_CHANGE = (
    "epochs",
    "progress",
    "device",
    "data_on",
    "cuda_graphs",
    "first_layer",
    "eval_batch_size",
    "checkpoint_every",
    "patience",
    "budget",
)


load_run_config = rundir.load_config  # vaecf 0.1 name


def _leftover(path: Path) -> bool:
    """A temp file of an interrupted atomic write (`.NAME.*.tmp`, as
    vaecf.storage.safewrite.atomic_file names it)."""
    return path.is_file() and path.name.startswith(".") and path.name.endswith(".tmp")


def model_name_of(model_config) -> str:
    """Registry name of a config dataclass instance."""
    named = getattr(model_config, "model", None)  # a config shared by several models names one
    for name, spec in SPECS.items():
        if type(model_config) is spec.Config and named in (None, name):
            return name
    raise ConfigError(f"{type(model_config).__name__} is no model's config")


def resolve_config(
    cfg: TrainConfig, model_cls: type[Model], n_train_users: int, model_config=None
) -> TrainConfig:
    """Refuse settings the model does not read; fill the unset ones from the model, its
    settings `model_config` (its default where None) and the data."""
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
            f"{', '.join(map(spelled, given))} "
            f"{'does' if len(given) == 1 else 'do'} not apply to {spelled('model', model_cls.name)}"
        )
    d = cfg.to_dict()
    d.update(model_cls.resolve_train(d, n_train_users, cfg.preset))
    if d["patience"] is None and "patience" in model_cls.train_settings:
        passes = sum(p.passes for p in model_cls.phases_of(model_config or model_cls.Config()))
        updates = passes * math.ceil(n_train_users / d["batch_size"])
        d["patience"] = 0 if cfg.preset == "paper" else auto_patience(updates)
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
            + ", ".join(f"{spelled(n, getattr(given, n))} (run: {saved[n]!r})" for n in clash)
            + f" conflict. A resume may change only {', '.join(RESUME_MAY_CHANGE)}; "
            "start a new --out to train with other settings"
        )
    for n in RESUME_MAY_CHANGE:
        v = getattr(given, n)
        if v is not None and v != getattr(defaults, n):
            setattr(config, n, v)
    config.progress = given.progress
    return config


def train(
    data, config, out, model_config=None, resume=False, model=None, on_epoch=None, test=True,
    init=None,
):  # fmt: skip
    """vaecf.training.train (`vaecf.train`) for one model (not `auto`); `init(model)` sets a
    fresh gradient run's starting weights (an update's warm start; a resume's come from
    last.pt)."""
    ds = data if isinstance(data, PreparedDataset) else PreparedDataset(data)
    out = Path(out)
    test = test and ds.manifest["counts"]["n_test_users"] > 0  # a production split has none
    if model is not None and not models.get(model).trainable:
        raise ConfigError(f"--model {model} is made by --model auto, not trained on its own")
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun rank 0 holds the lock
        return _train(ds, config, out, model_config, resume, model, on_epoch, test, init)
    with writer_lock(out, "vaecf train"):
        return _train(ds, config, out, model_config, resume, model, on_epoch, test, init)


def _what_to_train(ds, config, out, model_config, resume, model):
    """(train config, model config, model name): a resumed run's own (its directory cleared of
    writes a kill interrupted), or the given ones resolved for a fresh run in `out`."""
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
            f"{out} already holds a run; pass {spelled('resume', True)} to continue it or choose "
            f"another {spelled('out')}"
        )
    elif out.exists() and any(not _leftover(p) for p in out.iterdir()):
        raise RunError(f"{out} exists and is not a run directory; choose another {spelled('out')}")
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
            config or TrainConfig(),
            models.get(name),
            ds.manifest["counts"]["n_train_users"],
            model_config,
        )
    return config, model_config, name


def _train(ds, config, out, model_config, resume, model, on_epoch, test, init) -> RunResult:
    config, model_config, name = _what_to_train(ds, config, out, model_config, resume, model)
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
        trainer_cls = ClosedFormFit if models.get(name).closed_form else GradientFit
        run = trainer_cls(ds, config, name, model_config, out, ctx, device)
        if init is not None:
            init(run.model)
            run.warm = True
        run.on_epoch = on_epoch
        run.score_test = test
        return run.fit()
    finally:
        if started:
            distributed.teardown()
