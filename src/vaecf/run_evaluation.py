"""A run's best model judged on one of its dataset's held-out splits (`vaecf evaluate`): any
metrics (vaecf.metrics), each scored user's values (the per-user file: their id, the size of
their history, each per-user metric) and the means by history-length slice.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.data.sources import USER
from vaecf.errors import ConfigError, RunError
from vaecf.evaluate import DEFAULT_METRICS, evaluate_users, model_scores
from vaecf.metrics import parse_metric, self_information
from vaecf.recommender import Recommender
from vaecf.rundir import load_config

# history-length slices (items in the fold-in history): (label, lowest, highest or None)
SLICES = (("1-5", 1, 5), ("6-20", 6, 20), ("21-100", 21, 100), ("over 100", 101, None))
PER_USER_SUFFIXES = (".csv", ".parquet")


@dataclass
class Evaluation:
    """What `evaluate_run` found: the means (and n_users, n_skipped), each scored user's values
    (a frame: user id, history, each per-user metric), and the means by slice."""

    split: str
    summary: dict
    per_user: pl.DataFrame
    slices: list[dict]


def parse_metrics(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """'recall@20,map@10' (or a list) -> the labels, each checked; None: the defaults."""
    if text is None:
        return DEFAULT_METRICS
    labels = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    labels = [t for t in labels if t]
    if not labels:
        raise ConfigError("--metrics is empty: give NAME@K,... (e.g. recall@20,map@10)")
    for label in labels:
        parse_metric(label)
    return tuple(dict.fromkeys(labels))


def check_per_user_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.suffix.lower() not in PER_USER_SUFFIXES:
        raise ConfigError(f"--per-user {path}: name a .csv or .parquet file")
    return path


def evaluate_run(
    run: str | os.PathLike, data=None, split: str = "test", metrics=DEFAULT_METRICS,
    device: str = "auto", precision: str | None = None,
) -> Evaluation:  # fmt: skip
    """Score the run's best model on `split` of its dataset (or `data`, the same one moved).
    `precision` None: the run's training precision (reproduces results.json); else a
    serving copy in that precision, scored as `vaecf serve --precision` would."""
    cfg = load_config(run)
    ds = PreparedDataset(data or cfg["data"]["path"])
    if ds.fingerprint != cfg["data"]["fingerprint"]:
        raise RunError(f"{ds.path} is not the dataset {run} was trained on; pass its --data")
    _check_split(ds, split)
    if precision is None:
        rec, precision = Recommender.load(run, device=device), cfg["train"]["precision"]
    else:
        rec = Recommender.load(run, device=device, precision=precision)
        precision = precision if precision in ("fp32", "tf32") else "fp32"
    fold_in, target = (CSR.from_scipy(ds.split(f"{split}_{p}"), rec.device) for p in ("tr", "te"))
    train = ds.split("train")
    info = self_information(torch.from_numpy(train.getnnz(axis=0)), train.shape[0])
    info = info.to(rec.device)
    rec.model.eval()
    score = model_scores(rec.model, precision)
    summary, per = evaluate_users(score, fold_in, target, metrics, info=info)  # one pass
    rows = per.pop("row").numpy()
    ids = ds.users.filter(pl.col("split") == split).get_column(USER)
    history = np.diff(ds.split(f"{split}_tr").indptr)[rows]
    frame = pl.DataFrame({USER: ids.gather(rows), "history": history})
    frame = frame.with_columns(pl.Series(m, v.numpy()) for m, v in per.items())
    return Evaluation(split, summary, frame, slice_means(frame, list(per)))


def _check_split(ds: PreparedDataset, split: str) -> None:
    if ds.manifest["counts"][f"n_{split}_users"]:
        return
    other = "validation" if split == "test" else "test"
    has_other = ds.manifest["counts"][f"n_{other}_users"]
    raise ConfigError(
        f"{ds.path} holds no {split} users (every user trained the model, as `vaecf.fit` "
        f"and `--heldout-users 0` prepare): "
        + (f"evaluate --split {other}, or " if has_other else "")
        + "prepare the data with held-out users (`vaecf prepare ... --heldout-users N`) "
        "and train on that"
    )


def slice_means(per_user: pl.DataFrame, metrics: Sequence[str]) -> list[dict]:
    """Each history-length slice's user count and per-user metric means (slices without
    users left out)."""
    out = []
    for label, lo, hi in SLICES:
        cond = pl.col("history") >= lo
        if hi is not None:
            cond = cond & (pl.col("history") <= hi)
        part = per_user.filter(cond)
        if part.height:
            means = {m: float(part.get_column(m).mean()) for m in metrics if m in part.columns}
            out.append({"slice": label, "n_users": part.height, **means})
    return out


def write_per_user(frame: pl.DataFrame, path: Path) -> None:
    """The per-user frame to a .csv or .parquet file, written atomically."""
    from vaecf.storage.safewrite import atomic_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        if path.suffix.lower() == ".parquet":
            frame.write_parquet(f)
        else:
            frame.write_csv(f)
