"""`vaecf update`: a run kept current with a newer preparation of the same data (more
interactions, new users, new items; the same raw ids mean the same things), written as a new
run beside the old one, never over it.

What keeps each model current:
- EASE, EDLAE, inf-AE: fitted again on the newer training matrix at the settings the run chose
  (lambda, p, beta; inf-AE's ridge): one solve, no search (`search=True`: the search again).
  EASE, where its run keeps diag P beside a dense B: the run's inverse updated by the rows of
  X^T X that changed instead, where that costs less than the solve (vaecf.models.linear_update;
  the same B to float rounding); the rows it solved on are the run's own (gram_rows.pt), or,
  in a run written before it kept them, its prepared data's.
- Mult-VAE, Mult-DAE, RecVAE: a warm start. Every weight indexed by item is carried over item
  by item (by raw id); a new item's rows start at the mean of the old items' (a typical item);
  then training on the newer training users with early stopping within the budget. The warm
  start itself is validated first, as epoch 0, and kept where no epoch beats it (ten Mult-VAE
  updates in a row, patience 3, drifted -0.0144 test NDCG@100 from a retrain when each had to
  keep one of its own epochs, -0.0090 with this); the first epoch without gain ends the update
  (patience 1, or `patience`): a warm start is near its best, and on ML-1M by time patience 2
  and 3 kept the same epochs as 1 in 1.5 and 2 times the time (benchmarks/README.md). RecVAE's
  warm start is shrunk halfway toward a fresh start
  (WARM_SHRINK; "shrink and perturb", Ash & Adams, NeurIPS 2020): its composite prior is the
  encoder's own earlier posterior, so the run's weights anchored it to the older data. On ML-1M
  by time (80% -> all) its update's test NDCG@100 went 0.2181 -> 0.2237 against the retrain's
  0.2251; Mult-VAE's fell with it (0.2223 -> 0.2153) and is not shrunk (benchmarks/README.md).
- Popularity: counted again.
- A blend (`--model auto`'s choice of one): not updated; train `--model auto` again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp
import torch

from vaecf import models, rundir
from vaecf.config.settings import spelled
from vaecf.config.train import TrainConfig
from vaecf.data.prepare import PreparedDataset
from vaecf.data.preprocess import TIME_PROTOCOLS
from vaecf.data.vocab import Vocabulary
from vaecf.errors import ConfigError, DataError, RunError
from vaecf.models.linear import penalty
from vaecf.models.linear_update import Inverse
from vaecf.training.run import RunResult
from vaecf.training.single import train

MIN_SHARED = 0.5  # the share of the run's items the newer data must still hold
PINNED = {  # a closed form's searched settings and the grids that searched them
    "l2": ("l2_grid",),
    "dropout": ("dropout_grid",),
    "ridge": ("ridge_grid",),
}
UPDATE_PATIENCE = 1
# the share of the run's weights a warm start keeps, the rest a fresh start's (1: all the run's)
WARM_SHRINK = {"recvae": 0.5}


def item_map(old: Vocabulary, new: Vocabulary, run: Path, data: Path) -> np.ndarray:
    """(len(new),) int64: each newer item's index in the run's vocabulary, -1 for a new one.
    DataError where the two do not share at least MIN_SHARED of the run's items (another
    source, or ids spelled another way)."""
    pos = np.full(len(new), -1, dtype=np.int64)
    if old.ids.dtype == new.ids.dtype:  # ids of one kind (integers or text) on both sides
        both = pl.DataFrame({"id": new.ids, "new": np.arange(len(new))}).join(
            pl.DataFrame({"id": old.ids, "old": np.arange(len(old))}), on="id"
        )
        pos[both.get_column("new").to_numpy()] = both.get_column("old").to_numpy()
    shared = int((pos >= 0).sum())
    if shared < MIN_SHARED * len(old):
        raise DataError(
            f"{data} shares {shared:,} of the {len(old):,} items of {run}: it is not a newer "
            "preparation of the run's data (another source, or ids spelled another way); "
            f"train on it instead (vaecf train --data {data})"
        )
    return pos


def warm_start(old_state: dict, old_n: int, pos: np.ndarray, keep: float = 1.0):
    """`init(model)` for single.train: every tensor of the run's weights copied in, those with
    an item dimension (old_n there, len(pos) in the model) item by item, new items at the mean
    of the old rows; a tensor the model holds in another shape keeps its fresh start. With
    `keep` < 1 each floating tensor is then keep * that + (1 - keep) * its fresh start."""
    new_n = len(pos)
    have = torch.from_numpy(np.flatnonzero(pos >= 0))
    src = torch.from_numpy(pos[pos >= 0])
    fresh = torch.from_numpy(np.flatnonzero(pos < 0))

    @torch.no_grad()
    def init(model) -> None:
        fresh_start = {k: v.clone() for k, v in model.state_dict().items()} if keep < 1 else {}
        carry(model)
        for name, t in model.state_dict().items():
            if name in fresh_start and t.is_floating_point():
                t.mul_(keep).add_(fresh_start[name], alpha=1.0 - keep)

    def carry(model) -> None:
        for name, t in model.state_dict().items():
            old = old_state.get(name)
            if old is None or old.dim() != t.dim():
                continue
            old = old.to(t.device, t.dtype)
            dims = [d for d in range(t.dim()) if old.shape[d] == old_n and t.shape[d] == new_n]
            rest = [d for d in range(t.dim()) if d not in dims]
            if len(dims) > 1 or any(old.shape[d] != t.shape[d] for d in rest):
                continue
            if not dims:
                t.copy_(old)
                continue
            d = dims[0]
            t.index_copy_(d, have.to(t.device), old.index_select(d, src.to(t.device)))
            if len(fresh):
                mean = old.mean(dim=d, keepdim=True).expand_as(t.index_select(d, fresh))
                t.index_copy_(d, fresh.to(t.device), mean.contiguous())

    return init


def held_out_seen(cfg: dict, ds: PreparedDataset) -> int:
    """How many of `ds`'s validation and test users were training users of the run (whose
    config is `cfg`): 0 under a time protocol, where the held-out periods come after anything
    the run saw, or where the run's dataset is gone."""
    path = cfg["data"].get("path")
    if ds.manifest["settings"]["protocol"] in TIME_PROTOCOLS or not path:
        return 0
    if not (Path(path) / "manifest.json").is_file():
        return 0
    old = PreparedDataset(path).users
    trained = old.filter(pl.col("split") == "train").get_column("user_id")
    held = ds.users.filter(pl.col("split") != "train").get_column("user_id")
    return int(held.is_in(trained.implode()).sum()) if held.dtype == trained.dtype else 0


def ease_start(run: Path, cfg: dict, pos: np.ndarray, log: Callable[[str], None]):
    """`init` for an EASE update: the run's inverse as the fit's start, with the X^T X rows
    the run kept (gram_rows.pt) or, for a run written before it kept them, its prepared data's;
    None (and a line to `log` saying why) where the run keeps no diag P (from before run
    format 3) or has neither."""
    saved = cfg["model"]["config"]
    if cfg.get("format_version", 1) < 3:
        return log("EASE: solved again: the run is from before run format 3 (no diag P kept)")
    if (rows := rundir.load_rows(run)) is None and (rows := dataset_rows(cfg, log)) is None:
        return None

    def weights():  # read only where the change is small enough to use them
        model, _ = rundir.load_model(run, "cpu")
        if model.sparse or not model.p_diag.numel():  # a sparse B
            return None
        counts = torch.from_numpy(rows.getnnz(axis=0))  # the Gram's diagonal: rows are binary here
        b = model.weight.to(getattr(torch, saved.get("solve_dtype", "float32")))
        return b.div_(
            penalty(counts, saved.get("popularity_exponent", 0.0)).to(b.dtype)
        ), model.p_diag

    start = Inverse(weights, float(saved["l2"]), rows, pos)

    def init(m) -> None:
        m.start = start

    return init


def dataset_rows(cfg: dict, log: Callable[[str], None]) -> sp.csr_matrix | None:
    """The X^T X rows of a run's prepared data (training rows, and fold-in rows where the run
    adds them); None, said to `log`, where the data is gone or another preparation."""
    path = cfg["data"].get("path")
    if not path or not (Path(path) / "manifest.json").is_file():
        return log(f"EASE: solved again: the run's prepared data is gone from {path}")
    old = PreparedDataset(path)
    if old.fingerprint != cfg["data"].get("fingerprint") or old.n_items != cfg["data"]["n_items"]:
        return log(f"EASE: solved again: {path} holds another preparation than the run's")
    fold_in = cfg["model"]["config"].get("fold_in_rows", True)
    parts = ["train"] + (["validation_tr", "test_tr"] if fold_in else [])
    return sp.vstack([old.split(s) for s in parts]).tocsr()


def _pinned(name: str, saved: dict, search: bool):
    """The model settings an update fits with: the run's own, its searched settings held at
    what the search chose (no grid left to search) unless `search`."""
    settings = dict(saved)
    for key, grids in PINNED.items():
        if key not in settings:
            continue
        if search:
            settings[key] = None  # searched again over the run's grid
        elif settings[key] is not None:
            for g in grids:
                settings[g] = [settings[key]]
    if not search and "popularity_grid" in settings:
        settings["popularity_grid"] = []
    if not search and settings.get("selection") == "cv":
        settings["selection"] = "validation"  # one setting left: nothing to cross-validate
    return models.config_from_dict(name, settings)


def update(
    run: str | os.PathLike, data, out: str | os.PathLike, budget: float | None = None,
    search: bool = False, device: str | None = None, progress: bool = True,
    patience: int | None = None,
) -> RunResult:  # fmt: skip
    """Fit run `run`'s model to `data` (a newer prepared dataset of the same source) into the
    new run directory `out`, as the module's doc says for each model."""
    run, out = Path(run), Path(out)
    cfg = rundir.load_config(run)
    name = cfg["model"]["name"]
    spec = models.get(name)
    if spec.family == "selection":
        raise ConfigError(f"{run} holds a {name} model, which update cannot keep current: "
                          "train --model auto again on the newer data")  # fmt: skip
    if out.resolve() == run.resolve() or rundir.is_run(out):
        raise RunError(f"{out} already holds a run: an update writes a new run, never over one; "
                       f"choose another {spelled('out')}")  # fmt: skip
    ds = data if isinstance(data, PreparedDataset) else PreparedDataset(data)
    pos = item_map(Vocabulary.load(run / rundir.ITEMS), ds.items, run, ds.path)
    keep = {k: v for k, v in cfg["train"].items() if k in TrainConfig.__dataclass_fields__}
    tcfg = TrainConfig(**{**keep, "progress": progress})
    tcfg = replace(tcfg, budget=budget, device=device or tcfg.device)
    init = None
    if not spec.closed_form:
        # the warm start is near its best: an epoch without gain ends it (unless `patience`), but
        # not before one of its own is validated (a run that validates every few epochs)
        patience = max(UPDATE_PATIENCE if patience is None else patience, tcfg.eval_every)
        tcfg = replace(tcfg, patience=patience)
        old_model, _ = rundir.load_model(run, "cpu")
        init = warm_start(old_model.state_dict(), old_model.n_items, pos, WARM_SHRINK.get(name, 1))
        if seen := held_out_seen(cfg, ds):
            print(f"vaecf update: {seen:,} of the newer data's validation and test users trained "
                  f"{run}'s model: its warm start has seen their held-out items, so the new "
                  "run's validation and test figures are optimistic (a time protocol, "
                  "--protocol temporal, holds out what came after)", flush=True)  # fmt: skip
    saved = cfg["model"]["config"]
    if name == "ease" and not search:
        init = ease_start(run, cfg, pos, print if progress else lambda line: None)
    mcfg = (
        _pinned(name, saved, search) if spec.closed_form else models.config_from_dict(name, saved)
    )
    return train(ds, tcfg, out, mcfg, model=name, init=init)
