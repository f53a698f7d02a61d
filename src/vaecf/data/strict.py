"""The strict typed reads the named formats (`vaecf.data.parsers`) are built on: a file read
with one typed column per field, and when that read fails (or yields a null, a non-finite or a
negative value where none may be), a plain line scan that names the first bad line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import polars as pl

from vaecf.errors import DataError

_INT = r"^-?\d+$"  # as Polars reads them: no surrounding blanks
_NUM = r"^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$"


def _first_bad_line(
    path: Path,
    sep: str,
    kinds: tuple[str, ...],
    header: bool,
    names: tuple[str, ...],
    nonneg: tuple[str, ...] = (),
) -> str:
    """'line N: what is wrong' for the first line that does not hold len(kinds) typed fields."""
    checks = {"int": re.compile(_INT, re.ASCII), "num": re.compile(_NUM, re.ASCII), "str": None}
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError:
                return f"line {n}: not valid UTF-8 text ({raw[:60]!r})"
            if header and n == 1:
                continue
            line = line.rstrip("\r\n")
            fields = line.split(sep)
            if len(fields) != len(kinds):
                return (
                    f"line {n}: {len(fields)} field(s) where {len(kinds)} "
                    f"({', '.join(names)}) are expected: {line[:80]!r}"
                )
            for value, kind, name in zip(fields, kinds, names, strict=False):
                rx = checks[kind]
                if value.strip() == "" or (rx is not None and not rx.match(value)):
                    return f"line {n}: {name} is {value[:40]!r}, not {'a number' if rx else 'set'}"
                if kind in ("int", "num"):
                    try:
                        v = float(value)
                    except ValueError:
                        return f"line {n}: {name} is {value[:40]!r}, not a number"
                    if kind == "int" and abs(int(value)) >= 2**63:
                        return f"line {n}: {name} is {value[:40]!r}, too large for an integer id"
                    if not math.isfinite(v) or (name in nonneg and v < 0):
                        return f"line {n}: {name} is {value[:40]!r}, not a valid {name}"
    return "the line scan found no single bad line (is the file damaged?)"


def typed_read(
    path: Path,
    sep: str,
    kinds: tuple[str, ...],
    names: tuple[str, ...],
    header: bool,
    select: tuple[str, ...],
    what: str,
    nonneg: tuple[str, ...] = (),
) -> pl.DataFrame:
    """Read `path` with one typed column per name; any null, non-finite number or negative value
    in a `nonneg` column is an error naming the first bad line."""
    dtypes = {"int": pl.Int64, "num": pl.Float64, "str": pl.String}
    schema = {n: dtypes[k] for n, k in zip(names, kinds, strict=False)}
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; is it a complete {what} file? Download it again")
    last = names[-1]  # a short row leaves the last field null: read it to notice
    floats = [n for n, k in zip(names, kinds, strict=False) if k == "num" and n in select]
    try:
        df = (
            pl.scan_csv(path, separator=sep, has_header=header, schema=schema, quote_char=None)
            .select(*select, *([] if last in select else [pl.col(last).is_null().alias("_e")]))
            .collect()
        )
        bad = df.select(pl.any_horizontal(pl.all().is_null()).any()).item()
        for n, k in zip(names, kinds, strict=False):
            if k == "str" and n in select:
                bad = bad or bool((df.get_column(n).str.strip_chars() == "").any())
        if "_e" in df.columns:
            bad = bad or bool(df.get_column("_e").any())
            df = df.drop("_e")
        for n in floats:
            bad = bad or not bool(df.get_column(n).is_finite().all())
        for n in nonneg:
            bad = bad or bool((df.get_column(n) < 0).any())
    except pl.exceptions.PolarsError:
        bad = True
    if bad:
        where = _first_bad_line(path, sep, kinds, header, names, nonneg)
        raise DataError(
            f"{path}, {where}. This is not the {what} format; fix or re-download the file"
        )
    if df.height == 0:
        raise DataError(f"{path} holds no rows; is it a complete {what} file?")
    return df


def read_lines(path: Path, what: str, lossy: bool = False) -> pl.DataFrame:
    """Every line of `path` as one string column (blank lines are nulls, numbering kept);
    `lossy` replaces invalid UTF-8 instead of refusing it."""
    try:
        return pl.read_csv(
            path,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            schema={"line": pl.String},
            encoding="utf8-lossy" if lossy else "utf8",
        )
    except pl.exceptions.PolarsError as e:
        where = f"unreadable ({str(e).splitlines()[0][:120]})"
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                if b"\x1f" in raw:
                    where = f"line {n}: holds a control character (0x1f)"
                    break
                if not lossy and _first_non_utf8_line_in(raw):
                    where = f"line {n}: not valid UTF-8 text"
                    break
        raise DataError(f"{path}, {where}; this is not the {what} format; re-download it") from None


def _first_non_utf8_line_in(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def one_file(paths: list[Path], what: str) -> Path:
    if len(paths) != 1:
        raise DataError(f"expected one {what} file, got {len(paths)}: {[str(p) for p in paths]}")
    return paths[0]
