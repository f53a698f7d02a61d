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
from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp

from vaecf.data import files
from vaecf.data.columns import (
    ITEM_NAMES,
    RATING_NAMES,
    USER_NAMES,
    found_by_name,
    guess_column,
    resolve_columns,
)
from vaecf.data.datasets import home
from vaecf.data.prepare import PreparedDataset, PrepareSettings, fingerprint, prepare_frame
from vaecf.data.separators import found_sep
from vaecf.data.sources import ITEM, NAME, RATING, USER, ids_of_floats, int_if_possible, read_table
from vaecf.errors import ConfigError, DataError

MAX_VALIDATION_USERS = 10_000  # the paper's held-out count on ML-20M; a share stops growing here


def _from_matrix(m, rating_col, min_rating) -> pl.DataFrame:
    """Rows of a scipy sparse matrix are users, columns items (ids: their indices); a stored
    value is a rating when `min_rating` is given, else every stored non-zero is an interaction."""
    if rating_col is not None:
        raise DataError("a sparse matrix has no columns: drop rating_col (its values are ratings)")
    coo = sp.coo_matrix(m)
    keep = coo.data != 0
    if not np.isfinite(coo.data).all():
        raise DataError("the matrix holds NaN or infinite values; replace them first")
    cols = {USER: coo.row[keep].astype(np.int64), ITEM: coo.col[keep].astype(np.int64)}
    if min_rating is not None:
        cols[RATING] = coo.data[keep].astype(np.float64)
    return pl.DataFrame(cols)


def _frame_columns(df: pl.DataFrame, user_col, item_col, rating_col) -> pl.DataFrame:
    if rating_col is not None and rating_col not in df.columns:
        raise DataError(f"rating_col={rating_col!r} is not a column; the columns: {df.columns}")
    out = {USER: df.get_column(user_col), ITEM: df.get_column(item_col)}
    if rating_col is not None:
        try:
            out[RATING] = df.get_column(rating_col).cast(pl.Float64)
        except pl.exceptions.PolarsError:
            raise DataError(f"column {rating_col!r} does not hold numeric ratings") from None
    frame = pl.DataFrame(out)
    null = frame.select(pl.any_horizontal(pl.all().is_null()).sum()).item()
    if null:
        raise DataError(
            f"{null} rows have no {user_col}, {item_col}"
            f"{'' if rating_col is None else ' or ' + rating_col}; drop them first"
        )
    for col in (USER, ITEM):
        s = frame.get_column(col)
        if s.dtype.is_float():
            s = ids_of_floats(s, f"column {(user_col if col == USER else item_col)!r}")
        elif not (s.dtype.is_integer() or s.dtype == pl.String):
            s = int_if_possible(s.cast(pl.String))
        frame = frame.with_columns(s.alias(col))
    return frame


def _from_pandas(df) -> pl.DataFrame:
    """The frame's columns as polars Series (numpy-backed; pyarrow is not needed)."""
    cols = {}
    for c in df.columns:
        missing = df[c].isna().to_numpy()  # NaN, None, pd.NA and NaT alike
        values = df[c].to_numpy()
        if missing.any() or values.dtype == object:  # nullable, string or categorical columns
            values = [None if m else v for v, m in zip(values.tolist(), missing.tolist())]
        cols[str(c)] = pl.Series(str(c), values, strict=False)
    return pl.DataFrame(cols)


def _from_python(data) -> pl.DataFrame:
    """{user: [items]} or [(user, item[, rating]), ...] as a frame of columns user, item[,
    rating]."""
    if isinstance(data, Mapping):
        for user, items in data.items():
            if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
                raise DataError(
                    f"data[{user!r}] is {type(items).__name__}: a dict maps each user to a "
                    "list of their items"
                )
        rows = [(u, i) for u, items in data.items() for i in items]
    else:
        rows = list(data)
    widths = {len(r) if isinstance(r, (list, tuple)) else 0 for r in rows}
    if not rows or len(widths) != 1 or widths.pop() not in (2, 3):
        raise DataError(
            "a list of interactions holds (user, item) or (user, item, rating) rows, all of one "
            f"length{'' if rows else '; this one is empty'}"
        )
    names = ["user", "item", "rating"][: len(rows[0])]
    return pl.DataFrame(
        {n: pl.Series(n, [r[k] for r in rows], strict=False) for k, n in enumerate(names)}
    )


def _read(data, cols, min_rating, sep, columns) -> tuple[pl.DataFrame, dict]:
    """(the interactions in vaecf's columns, the user, item and rating columns they came
    from and a file's separator where found in it: {} for a matrix)."""
    user_col, item_col, rating_col = cols
    if columns is not None and not isinstance(data, (str, os.PathLike)):
        raise DataError("columns= names a header-less file's columns; drop it for this data")
    if sp.issparse(data):
        return _from_matrix(data, rating_col, min_rating), {}
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        files.check_file(path)
        found = found_sep(path) if sep is None else None  # looked for once, read with below
        user_col, item_col, rating_col = resolve_columns(
            path, sep or found, user_col, item_col, rating_col, columns, min_rating is not None
        )
        header = columns is None
        frame = read_table(path, user_col, item_col, rating_col, sep or found, header, columns)
        return frame, {"user": user_col, "item": item_col, "rating": rating_col, "sep": found}
    if isinstance(data, pl.LazyFrame):
        data = data.collect()
    if isinstance(data, (Mapping, list, tuple)):
        data = _from_python(data)
    if not isinstance(data, pl.DataFrame):
        if type(data).__module__.split(".")[0] != "pandas" or not hasattr(data, "columns"):
            raise DataError(
                "data must be a pandas or Polars DataFrame, a scipy sparse matrix (users x "
                "items), {user: [items]}, a list of (user, item[, rating]) pairs or the path "
                f"of a text, JSON or Parquet file, not {type(data).__name__}"
            )
        data = _from_pandas(data)
    user_col = guess_column(data.columns, user_col, USER_NAMES, "user")
    item_col = guess_column(data.columns, item_col, ITEM_NAMES, "item")
    if min_rating is not None and rating_col is None:
        rating_col = guess_column(data.columns, None, RATING_NAMES, "rating")
    used = {"user": user_col, "item": item_col, "rating": rating_col}
    return _frame_columns(data, user_col, item_col, rating_col), used


def _names_frame(item_names) -> pl.DataFrame | None:
    if item_names is None:
        return None
    if not hasattr(item_names, "items"):
        raise DataError(
            "item_names must map item id -> name: a dict, or a pandas Series indexed by id "
            "(e.g. movies.set_index('movieId')['title'])"
        )
    pairs = list(item_names.items())
    # float keys (an index that held a NaN) name the integer ids the frame's columns become
    ids = [int(p[0]) if isinstance(p[0], float) and p[0].is_integer() else p[0] for p in pairs]
    return pl.DataFrame(
        {ITEM: pl.Series(ITEM, [str(i) for i in ids]), NAME: [str(p[1]) for p in pairs]}
    )


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
    resume: bool = False, serve_precision: str = "fp32", **settings,
):  # fmt: skip
    """Prepare, train and load: returns a `vaecf.Recommender`, within a time budget.

    data: a pandas or Polars DataFrame, a scipy sparse matrix (rows are users, columns items,
        ids their indices; stored values are ratings), {user: [items]}, a list of (user,
        item[, rating]) rows, or the path of a text/JSON/Parquet file with a header row
        (`sep`: its separator, one character, '::' or 'whitespace'; found in the file where not
        given; `columns`: the names of a file's columns in order where it has no header row,
        e.g. ["user", "item", "rating"]).
    user_col, item_col: the id columns (default: a column named like user/userId/user_id, and
        item/itemId/movieId/...); rating_col and min_rating: keep rows rated >= min_rating
        (default: every row is an interaction; with min_rating alone, the column named like
        rating/score/stars).
    model: "auto" (candidates compared on validation, the best kept) or a registry name
        (`vaecf.MODELS`: multvae, recvae, ease, edlae, ...).
    validation: the share (a fraction) or number of users held out to select the model and
        the epoch (default 10%, at most 10,000 users); test: a share of users held out and
        scored into `rec.results["test"]` (default 0: every other user trains).
    item_names: {item id: name}, returned with recommendations as titles.
    out: the run directory (for `vaecf serve --run`, `score`, `export`); default: under
        $VAECF_HOME/fits (~/.cache/vaecf/fits), named by the data and the settings, printed.
        The prepared data is kept there too (for `rec.recommend_user`).
    resume: continue the run an interrupted fit with the same data and settings left (or the
        one in `out`); without it a fit starts over (a run in an `out` you named is refused).
    settings: training settings (epochs, lr, batch_size, seed, device, precision, progress,
        patience, budget, ...) and the model's (`vaecf models` lists them), by name.
        budget: seconds for the whole fit, preparation included; default 60 s up to 100,000
        rows, plus 60 s for each further million (`default_budget` in this module).
    """
    from vaecf.recommender import Recommender
    from vaecf.training import train

    t0 = time.perf_counter()
    train_cfg, model_cfg = _split_settings(model, settings)
    train_cfg.validate()  # before any work
    frame, used = _read(data, (user_col, item_col, rating_col), min_rating, sep, columns)
    prep = _prepare_settings(frame, validation, test, min_rating, min_user_items, min_item_users)
    ds, work = _prepared_for(frame, replace(prep, seed=split_seed), item_names, model, settings)
    run_dir = Path(out) if out is not None else work / "run"
    if out is None and not resume and run_dir.exists():
        shutil.rmtree(run_dir)  # an earlier fit of the same data and settings: start over
    if train_cfg.budget is None:
        left = default_budget(frame.height) - (time.perf_counter() - t0)
        train_cfg.budget = round(max(1.0, left), 1)  # a tenth of a second: shown in the card
    if train_cfg.progress:
        _say_plan((user_col, item_col, rating_col), used, min_rating, model, train_cfg, run_dir)
    try:
        train(ds, train_cfg, run_dir, model_config=model_cfg, model=model, resume=resume)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"vaecf.fit stopped; its run is kept in {run_dir}: the same vaecf.fit(..., "
            "resume=True) continues it"
        ) from None
    return Recommender.load(run_dir, device=train_cfg.device, precision=serve_precision)


def _prepared_for(frame, prep, item_names, model: str, settings: dict):
    """The prepared dataset of `frame` under fit's work directory (named by the data, its
    preparation and the settings; an earlier fit's is reused), and that directory."""
    names = _names_frame(item_names)
    source = {"kind": "vaecf.fit", "n_rows": frame.height, "sha256": _digest(frame)}
    if names is not None:
        source["item_names"] = {"sha256": _digest(names)}
    work = home() / "fits" / _key(fingerprint(prep, source), model, settings)
    return _prepared(frame, work / "data", prep, source, names), work


def _prepare_settings(frame, validation, test, min_rating, min_user_items, min_item_users):
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
