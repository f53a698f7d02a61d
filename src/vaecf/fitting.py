"""`vaecf.fit`: interactions in memory (a DataFrame, a CSR matrix, a file) -> a trained
Recommender, in one call (the module is named apart from the function it exports).

    rec = vaecf.fit(ratings, user_col="userId", item_col="movieId", rating_col="rating",
                    min_rating=3.5)
    rec.recommend([1, 296, 318], k=10)

The data goes through the same preparation as `vaecf prepare` (binarize at `min_rating`, filter,
shuffle users with the seed), split for production: every user trains but a validation share,
whose held-out 20% picks the model and the epoch; no test users unless `test=` asks for them.
The prepared data and the run are kept in a working directory under $VAECF_HOME/fits named by
the data and the settings (printed; `out=DIR` puts the run there instead), so that an
interrupted fit continues with `resume=True`; the whole fit keeps to a time budget.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, fields
from pathlib import Path

import polars as pl

from vaecf.data.columns import (
    found_by_name,
)
from vaecf.data.datasets import home
from vaecf.data.inputs import names_frame, read_input
from vaecf.data.prepare import PreparedDataset, PrepareSettings, fingerprint, prepare_frame
from vaecf.data.sources import (
    USER,
)
from vaecf.errors import ConfigError, DataError
from vaecf.recommender import Recommender

MAX_VALIDATION_USERS = 10_000  # the paper's held-out count on ML-20M; a share stops growing here


def _split_settings(model: str, settings: dict):
    """(TrainConfig, model config) from fit's keyword settings, each routed to the one that
    declares it."""
    from vaecf import models
    from vaecf.config.train import TrainConfig

    cls = models.get(model).Config
    train_keys = {f.name for f in fields(TrainConfig)}
    model_keys = {f.name for f in fields(cls)} - {"model"}
    unknown = sorted(set(settings) - train_keys - model_keys)
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)}: not a setting of training or of model {model}. Training: "
            f"{', '.join(sorted(train_keys))}; {model}: {', '.join(sorted(model_keys)) or 'none'}"
        )
    train = TrainConfig(**{k: v for k, v in settings.items() if k in train_keys})
    model_cfg = models.config_from_dict(
        model, {k: v for k, v in settings.items() if k in model_keys and k not in train_keys}
    )
    return train, model_cfg


def _say_plan(cols: tuple, used: dict, min_rating, model: str, cfg, run_dir: Path) -> None:
    """What fit prints before training: the columns and separator it found (of those not
    given in `cols`), the budget, and where the run is kept."""
    given = dict(zip(("user", "item", "rating"), cols))
    if found := found_by_name(given, used, used.get("sep"), min_rating):
        print(f"vaecf.fit: {found}", flush=True)
    print(
        f"vaecf.fit: {model} within {cfg.budget:.0f} s; the run is kept in {run_dir} "
        "(resume=True continues it if interrupted)",
        flush=True,
    )


def default_budget(n_rows: int) -> float:
    """fit's wall-time budget in seconds when none is given: 60 s up to 100,000 interactions,
    plus 60 s for each further million (ML-1M's 1,000,209 ratings: 114 s)."""
    return 60.0 + 60.0 * max(0, n_rows - 100_000) / 1_000_000


def fit(
    data, user_col: str | None = None, item_col: str | None = None,
    rating_col: str | None = None, min_rating: float | None = None, model: str = "auto", *,
    validation: float | int = 0.1, test: float = 0.0, min_user_items: int = 5,
    min_item_users: int = 0, split_seed: int = 98765, item_names=None, sep: str | None = None,
    columns: list[str] | None = None, out: str | os.PathLike | None = None,
    resume: bool = False, serve_precision: str = "fp32", protocol: str | None = None,
    time_col: str | None = None, **settings,
):  # fmt: skip
    """Prepare, train and load: returns a `vaecf.Recommender`, within a time budget.

    data: a pandas or Polars DataFrame, a scipy sparse matrix (users x items), {user: [items]},
        (user, item[, rating]) rows, or the path of a text/JSON/Parquet file (how each is read:
        vaecf.data.inputs; `sep`: a file's separator, found where not given; `columns`: a
        header-less file's column names in order, e.g. ["user", "item", "rating"]).
    user_col, item_col: the id columns (default: a column named like user/userId/user_id, and
        item/itemId/movieId/...); rating_col and min_rating: keep rows rated >= min_rating
        (default: every row is an interaction; with min_rating alone, the column named like
        rating/score/stars).
    model: "auto" (candidates compared on validation, the best kept) or a registry name
        (`vaecf.MODELS`: multvae, recvae, ease, edlae, ...).
    validation: the share (a fraction) or number of users held out to select the model and
        the epoch (default 10%, at most 10,000 users); test: a share of users held out and
        scored into `rec.results["test"]` (default 0: every other user trains).
    protocol: "temporal": the last `test` share of the interactions by time is the test, the
        `validation` share before it selects; "last": each user's last interaction is the test,
        the one before it validation; the time column `time_col` or found by name.
    item_names: {item id: name}, returned with recommendations as titles.
    out: the run directory (for `vaecf serve --run`, `score`, `export`); default: under
        $VAECF_HOME/fits (~/.cache/vaecf/fits), named by the data and the settings, printed.
        The prepared data is kept there too (for `rec.recommend_user`).
    resume: continue an interrupted fit's run (a new fit starts over; a run in `out` refused).
    settings: training settings (epochs, lr, batch_size, seed, device, precision, progress,
        patience, budget, ...) and the model's (`vaecf models` lists them), by name.
        budget: seconds for the whole fit, preparation included (default: `default_budget`).
    """
    from vaecf.training import train

    t0 = _now()
    train_cfg, model_cfg = _split_settings(model, settings)
    train_cfg.validate()  # before any work
    how = FitInputs((user_col, item_col, rating_col, time_col), min_rating, sep, columns,
                    protocol, validation, test, min_user_items, min_item_users, split_seed,
                    model, settings)  # fmt: skip
    frame, used, ds, work = how.prepare(data, item_names, {})
    run_dir = _run_dir(out, work, resume)
    if train_cfg.budget is None:  # what is left of the default, to a tenth: shown in the card
        train_cfg.budget = round(max(1.0, default_budget(frame.height) + t0 - _now()), 1)
    if train_cfg.progress:
        _say_plan((user_col, item_col, rating_col), used, min_rating, model, train_cfg, run_dir)
    try:
        train(ds, train_cfg, run_dir, model_config=model_cfg, model=model, resume=resume)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"vaecf.fit stopped; its run is kept in {run_dir}: the same vaecf.fit(..., "
            "resume=True) continues it"
        ) from None
    return FittedRecommender.of(run_dir, how, train_cfg.device, serve_precision)


_now = time.perf_counter


@dataclass(frozen=True)
class FitInputs:
    """How `fit` read and prepared its data: `FittedRecommender.update` reads and prepares
    newer data of the same shape the same way."""

    cols: tuple  # (user, item, rating, time) columns as given (None: found by name)
    min_rating: float | None
    sep: str | None
    columns: list[str] | None
    protocol: str | None
    validation: float | int
    test: float
    min_user_items: int
    min_item_users: int
    split_seed: int
    model: str
    settings: dict

    def prepare(self, data, item_names, salt: dict):
        """(frame, the columns used, the prepared dataset, fit's working directory) of `data`
        (its directory named by the data, the preparation, the settings and `salt`)."""
        frame, used = read_input(data, self.cols, self.min_rating, self.sep, self.columns,
                                 self.protocol)  # fmt: skip
        prep = _prepare_settings(frame, self.protocol, self.validation, self.test,
                                 self.min_rating, self.min_user_items, self.min_item_users,
                                 self.split_seed)  # fmt: skip
        ds, work = _prepared_for(frame, prep, item_names, self.model, {**self.settings, **salt})
        return frame, used, ds, work


class FittedRecommender(Recommender):
    """What `vaecf.fit` returns: a Recommender that remembers how its data was read, so that
    `update` takes newer data in the same shape (a DataFrame, a file, ...)."""

    fit_inputs: FitInputs

    @classmethod
    def of(cls, run_dir, how: FitInputs, device: str, precision: str) -> FittedRecommender:
        rec = cls.load(run_dir, device=device, precision=precision)
        rec.fit_inputs = how
        return rec

    def update(
        self, data, *, item_names=None, out: str | os.PathLike | None = None,
        budget: float | None = None, search: bool = False, patience: int | None = None,
        progress: bool = True,
    ) -> FittedRecommender:  # fmt: skip
        """This model kept current with `data`, a newer export of the same source (more
        interactions, new users, new items; the same ids mean the same things) read and
        prepared as `fit` read this one's: a new run (`out`, default beside the newer data's
        preparation under $VAECF_HOME/fits), never over this one, loaded. What keeps each
        model current, and `budget`/`search`/`patience`: `vaecf.update` (vaecf update)."""
        from vaecf.training.update import update

        how = self.fit_inputs
        _, _, ds, work = how.prepare(data, item_names, {"updated_from": self.source})
        run_dir = _run_dir(out, work, resume=False)
        if progress:
            print(f"vaecf update: {self.source} kept current with the newer data into {run_dir}",
                  flush=True)  # fmt: skip
        update(self.source, ds, run_dir, budget, search, str(self.device), progress, patience)
        return FittedRecommender.of(run_dir, how, str(self.device), self.precision)


def _run_dir(out, work: Path, resume: bool) -> Path:
    """`out`, or the run beside fit's prepared data (an earlier fit's removed: it starts over,
    unless `resume`)."""
    if out is not None:
        return Path(out)
    if not resume and (work / "run").exists():
        shutil.rmtree(work / "run")
    return work / "run"


def _prepared_for(frame, prep, item_names, model: str, settings: dict):
    """The prepared dataset of `frame` under fit's work directory (named by the data, its
    preparation and the settings; an earlier fit's is reused), and that directory."""
    names = names_frame(item_names)
    source = {"kind": "vaecf.fit", "n_rows": frame.height, "sha256": _digest(frame)}
    if names is not None:
        source["item_names"] = {"sha256": _digest(names)}
    work = home() / "fits" / _key(fingerprint(prep, source), model, settings)
    return _prepared(frame, work / "data", prep, source, names), work


def _prepare_settings(
    frame, protocol, validation, test, min_rating, min_user_items, min_item_users, seed
) -> PrepareSettings:
    """fit's preparation: held-out users (a share or number of them) or a time `protocol`."""
    if protocol is not None:
        keep = dict(min_rating=min_rating, min_user_items=min_user_items, seed=seed)
        return _time_settings(protocol, validation, test, min_item_users=min_item_users, **keep)
    n_users = frame.get_column(USER).n_unique()
    if isinstance(validation, bool) or not isinstance(validation, (int, float)):
        raise ConfigError("validation must be a fraction (0.1) or a number of users (500)")
    if isinstance(validation, int):
        if validation < 1:
            raise ConfigError("validation must be at least 1 user")
        share = validation / max(n_users, 1)
    else:
        if not 0 < validation < 1:
            raise ConfigError("validation as a share must lie strictly between 0 and 1")
        share = min(validation, MAX_VALIDATION_USERS / max(n_users, 1))
    return PrepareSettings(
        min_rating=min_rating,
        min_item_users=min_item_users,
        min_user_items=min_user_items,
        protocol="thesis",
        validation_frac=min(share, 0.5),
        test_frac=test,
        seed=seed,
    )


def _time_settings(protocol: str, validation, test, **keep) -> PrepareSettings:
    if protocol == "temporal":
        if isinstance(validation, int):
            raise ConfigError(
                "protocol='temporal' takes validation= as a share of the interactions"
            )
        return PrepareSettings(
            protocol=protocol, validation_share=validation, test_share=test, **keep
        )
    if protocol == "last":
        return PrepareSettings(protocol=protocol, **keep)
    raise ConfigError(
        f"protocol must be 'temporal', 'last' or None (held-out users), not {protocol!r}"
    )


def _digest(frame: pl.DataFrame) -> str:
    """A digest of the frame's content, rows in order."""
    return hashlib.sha256(frame.hash_rows(seed=0).to_numpy().tobytes()).hexdigest()


def _key(data_fingerprint: str, model: str, settings: dict) -> str:
    """The name of a fit's working directory: its data and the settings a resume keeps."""
    from vaecf.training.single import RESUME_MAY_CHANGE

    kept = {k: v for k, v in settings.items() if k not in RESUME_MAY_CHANGE}
    blob = json.dumps([data_fingerprint, model, kept], sort_keys=True, default=str)
    return f"{model}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _prepared(frame, out: Path, prep, source, names):
    """The data prepared into `out`, or what an earlier fit of the same data prepared there."""
    if (out / "manifest.json").is_file():
        try:
            ds = PreparedDataset(out)
            if ds.fingerprint == fingerprint(prep, source):
                ds.verify()
                return ds
        except DataError:
            pass  # damaged: prepare it again
    if out.exists():
        shutil.rmtree(out)
    return prepare_frame(frame, out, prep, source=source, item_names=names)
