"""Reading interaction tables: any CSV, TSV, whitespace-separated or Parquet file -> a Polars
frame of (user_id, item_id[, rating]) in file order (the named formats' strict typed reads are
`vaecf.data.strict`).

Raw ids are kept as integers when every value spells one as a query's id is read (so they sort
numerically, as the paper's pandas code does; `int_if_possible`) and as strings otherwise. A
read that fails names the first bad line.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from vaecf.config.settings import spelled
from vaecf.data import files
from vaecf.data.separators import SPLIT_SEPS, WHITESPACE, sep_for, sep_hint
from vaecf.data.vocab import INT_ID
from vaecf.errors import DataError

USER, ITEM, RATING = "user_id", "item_id", "rating"
TIME = "time"  # when the interaction happened: a sortable number (the time protocols)
NAME = "name"  # an item's display name (item names files; read_lastfm(names=True))


def no_header(columns: bool = False) -> str:
    """A header-less file's setting (with its column names) as the message's reader spells it:
    `--no-header --columns` or `header=False, columns=`."""
    said = spelled("no_header", python="header=False")
    return (
        f"{said}{', ' if said.endswith('=False') else ' '}{spelled('columns')}" if columns else said
    )


def check_columns(header: bool, columns, named: bool = False) -> list[str] | None:
    """The names given to a header-less file's columns (None for a file with a header row)."""
    if columns is not None and isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",")]
    if header:
        if columns:
            raise DataError(
                f"{spelled('columns')} names the columns of a file without a header row; add "
                f"{no_header()}, or drop {spelled('columns')} and use the file's own header names"
            )
        return None
    if named:
        raise DataError(
            f"{no_header()} applies to CSV/TSV text files; Parquet and JSON name their columns"
        )
    if not columns:
        raise DataError(
            f"{no_header()} needs {spelled('columns')} to name the file's columns in "
            "order, e.g. --columns user,item,rating (columns=['user', 'item', 'rating'])"
        )
    columns = list(columns)
    if any(not c for c in columns) or len(set(columns)) != len(columns):
        raise DataError(
            f"{spelled('columns')} {','.join(columns)!r}: give distinct, non-empty names"
        )
    return columns


def _split_frame(src, path: Path, columns: list[str] | None, sep: str) -> pl.DataFrame:
    """A text file whose fields are split by runs of spaces/tabs (`sep` WHITESPACE) or by '::',
    as String columns (blank lines skipped); the header row names the columns unless `columns`
    does."""
    lines = pl.read_csv(
        src, has_header=False, separator="\x1f", quote_char=None, schema={"line": pl.String}
    )
    f = (
        lines.with_row_index("n", offset=1)
        .filter(pl.col("line").is_not_null() & (pl.col("line").str.strip_chars() != ""))
        .select(
            "n",
            pl.col("line").str.strip_chars().str.replace_all(r"[ \t\r]+", " ").str.split(" ")
            if sep == WHITESPACE
            else pl.col("line").str.strip_chars("\r").str.split(sep),
        )
    )
    if columns is None:
        if f.height == 0:
            raise DataError(f"{path} holds no header row; pass a file with interactions")
        columns = list(f.get_column("line")[0])
        f = f.slice(1)
    bad = f.filter(pl.col("line").list.len() != len(columns))
    if bad.height:
        n, fields = bad.row(0)
        raise DataError(
            f"{path}, line {n}: {len(fields)} field(s) where {len(columns)} "
            f"({', '.join(columns)}) are expected; fix the file or pass the right {spelled('sep')}"
        )
    return f.select(pl.col("line").list.get(i).alias(c) for i, c in enumerate(columns))


def int_if_possible(col: pl.Series) -> pl.Series:
    """Text ids as Int64 where every one spells an integer as a query's id is read
    (`vocab.INT_ID`: "42"; "042" or "+42" keep their spelling, as text: an ISBN's leading
    zeros are part of it, and "01" and "1" stay two ids), else the text unchanged."""
    text = col.str.strip_chars()
    if not text.str.contains(f"^(?:{INT_ID.pattern})$").all():
        return col
    as_int = text.cast(pl.Int64, strict=False)
    return as_int if as_int.null_count() == col.null_count() else col


def ids_of_floats(s: pl.Series, where: str) -> pl.Series:
    """Float ids (what pandas makes of an integer column that held a NaN) as the integers they
    spell: 13.0 -> 13. A value with a fraction, NaN, infinity or beyond 64-bit integers is an
    error naming it."""
    bad = ~s.is_finite() | (s != s.floor()) | (s.abs() >= 2.0**63)
    if bad.any():
        row = int(bad.arg_true()[0])
        raise DataError(
            f"{where}, row {row + 1}: id {s[row]!r} is not a whole number within 64-bit "
            "integers; ids must be integers or text (convert the column, e.g. with "
            ".astype('Int64') or .astype(str))"
        )
    return s.cast(pl.Int64)


def read_table(
    path: str | os.PathLike,
    user_col: str,
    item_col: str,
    rating_col: str | None = None,
    sep: str | None = None,
    header: bool = True,
    columns: list[str] | None = None,
    time_col: str | None = None,
) -> pl.DataFrame:
    """Read a delimited text, JSON or Parquet file of interactions (`files.kind`; text and JSON
    may be compressed) with named columns: a text file's header row names them, or `columns`
    does (`header=False`). `sep` is one character or 'whitespace' or '::', found in the file
    where not given (`sep_for`); LF, CRLF and bare-CR line endings are all read.

    Returns columns user_id, item_id and, with `rating_col`, rating (Float64), with
    `time_col`, time (`times`), in file order.
    """
    path = Path(path)
    files.check_file(path)
    what = files.kind(path)
    text = what == files.TEXT
    columns = check_columns(header, columns, not text)
    if path.stat().st_size == 0:
        raise DataError(
            f"{path} is empty; pass a file with {'a header row and ' if header else ''}interactions"
        )
    wanted = [user_col, item_col] + [c for c in (rating_col, time_col) if c]
    sep = sep_for(path, sep) if text else None
    lf, names = scan_table(path, sep, header, columns)
    missing = [c for c in wanted if c not in names]
    if missing:
        raise _missing_columns(path, missing, names, sep if text else None, columns)
    try:
        df = lf.select(wanted).collect()
    except pl.exceptions.PolarsError as e:
        if text:
            _check_utf8(path)
        where = json_bad_line(path) if what == files.JSON else None
        if text and sep not in SPLIT_SEPS:
            where = csv_bad_line(path, sep, None if columns is None else len(columns))
        where = where or f": {str(e).splitlines()[0][:200]}"
        raise DataError(
            f"cannot parse {path}{where}; fix the file"
            + (f" or pass the right {spelled('sep')}" if text else "")
        ) from None
    if df.height == 0:
        raise DataError(f"{path} has {'a header but ' if header else ''}no rows")
    out = {
        name: _ids(df.get_column(col), path, col)
        for name, col in ((USER, user_col), (ITEM, item_col))
    }
    if rating_col:
        out[RATING] = _ratings(df.get_column(rating_col), path, rating_col)
    if time_col:
        out[TIME] = times(df.get_column(time_col), f"{path}: column {time_col!r}")
    return pl.DataFrame(out)


def times(s: pl.Series, where: str) -> pl.Series:
    """A time column as a sortable Float64: numbers as they are (epoch seconds or milliseconds:
    only their order counts), ISO dates and date-times as epoch seconds. DataError naming the
    first value that is neither."""
    if s.dtype.is_numeric():
        t = s.cast(pl.Float64)
    elif s.dtype in (pl.Date, pl.Datetime):
        t = s.cast(pl.Datetime("ms")).dt.epoch("ms").cast(pl.Float64) / 1000.0
    else:
        text = s.cast(pl.String).str.strip_chars()
        t = text.cast(pl.Float64, strict=False)
        if t.null_count() > text.null_count():  # not numbers: dates
            try:
                parsed = text.str.to_datetime(strict=False, time_unit="ms")
                t = parsed.dt.epoch("ms").cast(pl.Float64) / 1000.0
            except pl.exceptions.PolarsError:  # no date format fits: the numbers' nulls stand
                pass
    bad = t.is_null() | t.is_nan()
    if bad.any():
        first = s.filter(bad)[0]
        raise DataError(
            f"{where}: {first!r} is not a time (epoch seconds or milliseconds, or an ISO date "
            "like 2024-05-01 or 2024-05-01T12:30:00); fix the file or pass the right --time-col"
        )
    return t.alias(TIME)


def _missing_columns(path: Path, missing: list, names: list, sep: str | None, columns) -> DataError:
    """The error of a read whose columns are not all in the file (`sep`: a text file's): what
    the file has, the separator that would split a one-column read, the flags to pass."""
    hint = sep_hint(names[0], sep) if len(names) == 1 and sep is not None else ""
    header = (
        ""
        if columns or sep is None
        else f"; {no_header(columns=True)} if the file has no header row"
    )
    return DataError(
        f"{path}: no column(s) {missing}; the file has columns {names}{hint}. "
        f"Pass the right {spelled('user_col')}/{spelled('item_col')}/{spelled('rating_col')}"
        f"{header}."
    )


def scan_table(
    path: Path, sep: str | None = None, header: bool = True, columns=None, typed: bool = False
):
    """The file as a lazy frame (text: of strings, or of the types Polars infers where `typed`;
    JSON and Parquet: their own types) and its column names (`columns` where given); text
    read with `sep` (`sep_for`)."""
    what = files.kind(path)
    try:
        if what == files.PARQUET:
            lf = pl.scan_parquet(files.source(path, text=False))
        elif what == files.JSON:
            lf = _scan_json(path)
        elif (sep := sep_for(path, sep)) in SPLIT_SEPS:
            lf = _split_frame(files.source(path), path, columns, sep).lazy()
        else:
            lf = pl.scan_csv(
                files.source(path),
                separator=sep,
                has_header=header,
                infer_schema=typed,  # else everything as strings, typed later with clear errors
                quote_char='"',
            )
        names = lf.collect_schema().names()
        if columns is not None and sep not in SPLIT_SEPS:
            if len(names) != len(columns):
                first = ",".join(names) if len(names) > 1 else files.first_line(path)
                raise DataError(
                    f"{path}, line 1: {len(names)} field(s), but {spelled('columns')} names "
                    f"{len(columns)} ({', '.join(columns)})"
                    + (sep_hint(first, sep) if len(names) == 1 else f"; is {spelled('sep')} right?")
                )
            lf, names = lf.rename(dict(zip(names, columns))), columns
    except (pl.exceptions.PolarsError, OSError) as e:
        if what == files.TEXT:
            _check_utf8(path)
        as_what = {files.PARQUET: "Parquet", files.JSON: "JSON"}.get(what, "CSV")
        where = json_bad_line(path) if what == files.JSON else None
        said = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot read {path} as {as_what}{where or f': {said}'}") from None
    return lf, names


def _check_utf8(path: Path) -> None:
    """A DataError naming the first line of the text that is not UTF-8, and how to convert it."""
    if n := files.first_non_utf8_line(path):
        raise DataError(
            f"cannot parse {path}, line {n}: not valid UTF-8 text (a Latin-1 or Windows "
            f"export?); convert it, e.g. iconv -f latin1 -t utf-8 {path} > utf8.csv"
        )


def _scan_json(path: Path) -> pl.LazyFrame:
    """JSON Lines (a record a line), or one array of records; every record's fields typed."""
    src = files.source(path)
    if files.head(path, 1 << 12).lstrip().startswith("["):
        return pl.read_json(src, infer_schema_length=None).lazy()
    return pl.scan_ndjson(src, infer_schema_length=None)


def json_bad_line(path: Path) -> str | None:
    """', line N: what is wrong' where Python's json module first fails to read a JSON Lines
    file's line as one record (or an array file, read whole); None if it reads them all."""
    import json

    with files.open_text(path) as f:
        array = f.read(1 << 12).lstrip().startswith("[")
        f.seek(0)
        lines = [f.read()] if array else f
        for n, line in enumerate(lines, 1):
            try:
                record = json.loads(line) if line.strip() else {}
            except ValueError as e:
                at = getattr(e, "lineno", 1) if array else n
                return f", line {at}: {getattr(e, 'msg', e)}"
            if not array and not isinstance(record, dict):
                return f", line {n}: not a record ({{...}})"
    return None


def _ids(s: pl.Series, path: Path, col: str) -> pl.Series:
    """Column `col`'s ids: integers where every value is one, else stripped text; none empty."""
    if s.dtype.is_float() and not s.is_null().any():
        s = ids_of_floats(s, f"{path}: column {col!r}")
    if not (s.dtype == pl.String or s.dtype.is_integer()):
        raise DataError(
            f"{path}: column {col!r} holds {s.dtype} values; ids must be integers or text"
        )
    if s.dtype == pl.String:
        s = s.str.strip_chars()
    missing = s.is_null() | (s == "") if s.dtype == pl.String else s.is_null()
    if missing.any():
        row = int(missing.arg_true()[0])
        raise DataError(f"{path}, data row {row + 1}: empty {col!r}; every row needs a {col}")
    if s.dtype == pl.String:
        s = int_if_possible(s)
    return s


def _ratings(s: pl.Series, path: Path, rating_col: str) -> pl.Series:
    """Column `rating_col` as finite Float64 ratings (a decimal comma read as a point: '4,5',
    as European spreadsheets write it), or an error naming the first bad row."""
    if not (s.dtype == pl.String or s.dtype.is_numeric()):
        raise DataError(f"{path}: column {rating_col!r} holds {s.dtype} values, not numbers")
    text = (
        s.str.strip_chars().str.replace(r"^([-+]?\d+),(\d+)$", "$1.$2")
        if s.dtype == pl.String
        else s
    )
    r = text.cast(pl.Float64, strict=False)
    bad = r.is_null() | r.is_nan() | r.is_infinite()
    if s.dtype == pl.String:
        bad = bad | s.is_null()
    if bad.any():
        row = int(bad.arg_true()[0])
        what = (
            "missing"
            if s[row] is None
            else f"{s[row]!r}, " + ("not a number" if r[row] is None else "not a finite number")
        )
        raise DataError(
            f"{path}, data row {row + 1}: {rating_col!r} is {what}; "
            f"fix the file or drop {spelled('rating_col')} to treat every row as a positive"
        )
    return r


def csv_bad_line(path: Path, sep: str, n_fields: int | None = None) -> str | None:
    """', line N: what is wrong' for the first row whose field count differs from the header's
    (or `n_fields`, for a file without one), or whose quoting is broken, as Python's csv module
    reads it (any line ending); None if none is found."""
    import csv

    if len(sep) != 1:
        return None
    with files.open_text(path) as f:
        r = csv.reader(f, delimiter=sep, quotechar='"', strict=True)
        try:
            want = len(next(r, [])) if n_fields is None else n_fields  # the header row
            what = "the header has" if n_fields is None else f"{spelled('columns')} names"
            for row in r:
                if row and len(row) != want:
                    return f", line {r.line_num}: {len(row)} field(s) where {what} {want}"
        except csv.Error as e:
            return f", line {r.line_num}: {e}"
    return None
