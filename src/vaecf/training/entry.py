"""`vaecf.train`: the one entry point that trains any model into a run directory. `--model auto`
goes to its selection (auto), which fits each candidate through single; every other
model goes to single (vaecf.training.single) directly."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from vaecf import models
from vaecf.config.train import TrainConfig
from vaecf.data.prepare import PreparedDataset
from vaecf.storage.writelock import writer_lock
from vaecf.training import single
from vaecf.training.auto import saved_settings, train_auto
from vaecf.training.single import RunResult


def train(
    data: PreparedDataset | str | os.PathLike,
    config: TrainConfig | None = None,
    out: str | os.PathLike = "runs/run",
    model_config=None,
    resume: bool = False,
    model: str | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    test: bool = True,
) -> RunResult:
    """Train (or fit) a model on a prepared dataset into run directory `out`; `resume=True`
    continues it. The model is `model` (a registry name, `auto` included) or the one
    `model_config` configures (default Mult-VAE with the paper's network). `on_epoch(row)` is
    called with every epoch's metrics row once it is saved (a tuner's pruner raises from it to
    stop the run). `test=False` leaves the test split unscored (results.json "test": null), for
    model selection that must not see it (vaecf tune scores the chosen run alone)."""
    if not (model == "auto" or isinstance(model_config, models.AutoConfig)):
        return single.train(data, config, out, model_config, resume, model, on_epoch, test)
    ds = data if isinstance(data, PreparedDataset) else PreparedDataset(data)
    test = test and ds.manifest["counts"]["n_test_users"] > 0  # a production split has none
    if resume and (config is None or model_config is None):  # the run's own settings
        given = saved_settings(out)
        config = config or given[0]
        model_config = model_config or given[1]
    config = config or TrainConfig()
    config.validate()
    log = tqdm.write if config.progress else (lambda s: None)
    with writer_lock(out, "vaecf train"):
        return train_auto(ds, config, Path(out), model_config or models.AutoConfig(), test, log)
