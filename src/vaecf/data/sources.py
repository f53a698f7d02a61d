"""Parsers: raw interaction files -> a Polars frame of (user_id, item_id[, rating]) in file order.

One function per format. Raw ids are kept as integers when every value is an integer (so they sort
numerically, as the paper's pandas code does) and as strings otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from vaecf.errors import DataError

USER, ITEM, RATING = "user_id", "item_id", "rating"


def _sep_for(path: Path, sep: str | None) -> str:
    if sep is not None:
        return {"\\t": "\t", "tab": "\t"}.get(sep, sep)
    return "\t" if path.suffix.lower() in {".tsv", ".tab"} else ","


def _int_if_possible(col: pl.Series) -> pl.Series:
    as_int = col.str.strip_chars().cast(pl.Int64, strict=False)
    if as_int.null_count() == col.null_count():
        return as_int
    return col


def read_table(
    path: str | os.PathLike,
    user_col: str,
    item_col: str,
    rating_col: str | None = None,
    sep: str | None = None,
) -> pl.DataFrame:
    """Read a CSV/TSV (header row) or Parquet file of interactions with named columns.

    Returns columns user_id, item_id and, with `rating_col`, rating (Float64), in file order.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist or is not a file; pass --path to a CSV/TSV/Parquet")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; pass a file with a header row and interactions")
    wanted = [user_col, item_col] + ([rating_col] if rating_col else [])
    is_parquet = path.suffix.lower() in {".parquet", ".pq"}
    try:
        if is_parquet:
            lf = pl.scan_parquet(path)
        else:
            lf = pl.scan_csv(
                path,
                separator=_sep_for(path, sep),
                infer_schema=False,  # everything as strings; typed below with clear errors
                quote_char='"',
            )
        names = lf.collect_schema().names()
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DataError(f"cannot read {path} as {'Parquet' if is_parquet else 'CSV'}: {e}") from None
    missing = [c for c in wanted if c not in names]
    if missing:
        hint = " (is --sep right?)" if len(names) == 1 and not is_parquet else ""
        raise DataError(
            f"{path}: no column(s) {missing}; the file has columns {names}{hint}. "
            "Pass the right --user-col/--item-col/--rating-col."
        )
    try:
        df = lf.select(wanted).collect()
    except pl.exceptions.PolarsError as e:
        raise DataError(f"cannot parse {path}: {e}") from None
    if df.height == 0:
        raise DataError(f"{path} has a header but no rows")
    out = {}
    for name, col in ((USER, user_col), (ITEM, item_col)):
        s = df.get_column(col)
        if s.dtype == pl.String:
            s = s.str.strip_chars()
        missing = s.is_null() | (s == "") if s.dtype == pl.String else s.is_null()
        if missing.any():
            row = int(missing.arg_true()[0])
            raise DataError(f"{path}, data row {row + 1}: empty {col!r}; every row needs a {col}")
        if s.dtype == pl.String:
            s = _int_if_possible(s)
        out[name] = s.alias(name)
    if rating_col:
        s = df.get_column(rating_col)
        r = s.cast(pl.Float64, strict=False) if s.dtype == pl.String else s.cast(pl.Float64)
        bad = r.is_null() & s.is_not_null() if s.dtype == pl.String else r.is_null()
        if s.dtype == pl.String:
            bad = bad | s.is_null()
        if bad.any():
            row = int(bad.arg_true()[0])
            raise DataError(
                f"{path}, data row {row + 1}: {rating_col!r} is {s[row]!r}, not a number; "
                "fix the file or drop --rating-col to treat every row as a positive"
            )
        out[RATING] = r.alias(RATING)
    return pl.DataFrame(out)
