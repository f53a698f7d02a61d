"""What `vaecf.fit` accepts as data, read into vaecf's interaction frame (user_id, item_id[,
rating][, time]): a pandas or Polars DataFrame, a scipy sparse matrix (users x items), {user:
[items]}, a list of (user, item[, rating]) rows, or the path of a text, JSON or Parquet file;
and item names given as a mapping.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp

from vaecf.data import files
from vaecf.data.columns import (
    ITEM_NAMES,
    RATING_NAMES,
    USER_NAMES,
    find_time_column,
    guess_column,
    pick_time_column,
    resolve_columns,
)
from vaecf.data.preprocess import TIME_PROTOCOLS
from vaecf.data.separators import found_sep
from vaecf.data.sources import (
    ITEM,
    NAME,
    RATING,
    USER,
    ids_of_floats,
    int_if_possible,
    read_table,
    times,
)
from vaecf.errors import DataError


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


def read_input(data, cols, min_rating, sep, columns, protocol=None) -> tuple[pl.DataFrame, dict]:
    """(the interactions in vaecf's columns, the user, item, rating and time columns they came
    from and a file's separator where found in it: {} for a matrix)."""
    user_col, item_col, rating_col, time_col = cols
    if columns is not None and not isinstance(data, (str, os.PathLike)):
        raise DataError("columns= names a header-less file's columns; drop it for this data")
    timed = protocol in TIME_PROTOCOLS
    if timed and (sp.issparse(data) or isinstance(data, (Mapping, list, tuple))):
        raise DataError(
            f"protocol={protocol!r} orders interactions by time: pass a DataFrame or a file with "
            "a time column (time_col=)"
        )
    if sp.issparse(data):
        return _from_matrix(data, rating_col, min_rating), {}
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        files.check_file(path)
        found = found_sep(path) if sep is None else None  # looked for once, read with below
        user_col, item_col, rating_col = resolve_columns(
            path, sep or found, user_col, item_col, rating_col, columns, min_rating is not None
        )
        time_col = find_time_column(path, sep or found, time_col, columns, protocol or "")
        header = columns is None
        frame = read_table(
            path, user_col, item_col, rating_col, sep or found, header, columns, time_col
        )
        used = {"user": user_col, "item": item_col, "rating": rating_col, "time": time_col}
        return frame, {**used, "sep": found}
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
    time_col = pick_time_column(data.columns, time_col, protocol or "", "the frame")
    used = {"user": user_col, "item": item_col, "rating": rating_col, "time": time_col}
    frame = _frame_columns(data, user_col, item_col, rating_col)
    if timed:
        frame = frame.with_columns(times(data.get_column(time_col), f"column {time_col!r}"))
    return frame, used


def names_frame(item_names) -> pl.DataFrame | None:
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
