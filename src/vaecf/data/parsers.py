"""The named datasets' formats: MovieLens (csv, dat), Netflix, Last.fm, Pinterest, MSD, and their
item names files, each read into a Polars frame of (user_id, item_id[, rating]) in file order.

One function per format (`PARSERS`, `NAMES_READERS`), on the generic reading of
`vaecf.data.sources` and the strict typed reads of `vaecf.data.strict`. Each returns the frame and
a dict of parse counts for the manifest.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from vaecf.data import files
from vaecf.data.separators import SPLIT_SEPS, default_sep, sep_for
from vaecf.data.sources import ITEM, NAME, RATING, TIME, USER, csv_bad_line, scan_table
from vaecf.data.strict import one_file, read_lines, typed_read
from vaecf.errors import DataError

Parsed = tuple[pl.DataFrame, dict]

ML_COLUMNS = ("userId", "movieId", "rating", "timestamp")


def read_movielens_csv(paths: list[Path]) -> Parsed:
    """MovieLens ratings.csv (ml-20m, ml-25m, ml-32m, ml-latest): header
    userId,movieId,rating,timestamp; ids are integers, ratings half stars."""
    path = one_file(paths, "ratings.csv")
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        head = f.readline().strip()
    if head != ",".join(ML_COLUMNS):
        raise DataError(
            f"{path}, line 1: header is {head[:80]!r}, not "
            f"{','.join(ML_COLUMNS)!r}; is this a MovieLens ratings.csv?"
        )
    df = typed_read(
        path,
        ",",
        ("int", "int", "num", "int"),
        ML_COLUMNS,
        True,
        ML_COLUMNS,
        "MovieLens ratings.csv",
        nonneg=("rating",),
    )
    return df.rename({"userId": USER, "movieId": ITEM, "rating": RATING, "timestamp": TIME}), {}


def read_movielens_dat(paths: list[Path]) -> Parsed:
    """MovieLens 1M/10M ratings.dat: UserID::MovieID::Rating::Timestamp, no header."""
    path = one_file(paths, "ratings.dat")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; download ml-1m again")
    lines = read_lines(path, "MovieLens ratings.dat")
    if lines.height == 0:
        raise DataError(f"{path} holds no rows; download ml-1m again")
    parts = lines.select(pl.col("line").str.split("::").alias("f"))
    df = parts.select(
        pl.col("f").list.len().alias("n"),
        pl.col("f")
        .list.get(0, null_on_oob=True)
        .str.strip_chars()
        .cast(pl.Int64, strict=False)
        .alias(USER),
        pl.col("f")
        .list.get(1, null_on_oob=True)
        .str.strip_chars()
        .cast(pl.Int64, strict=False)
        .alias(ITEM),
        pl.col("f")
        .list.get(2, null_on_oob=True)
        .str.strip_chars()
        .cast(pl.Float64, strict=False)
        .alias(RATING),
        pl.col("f").list.get(3, null_on_oob=True).str.strip_chars().cast(pl.Float64, strict=False)
        .alias(TIME),
    )  # fmt: skip
    bad = df.select(
        (
            (pl.col("n") != 4)
            | pl.col(TIME).is_null()
            | ~pl.col(TIME).is_finite()
            | pl.col(USER).is_null()
            | pl.col(ITEM).is_null()
            | pl.col(RATING).is_null()
            | ~pl.col(RATING).is_finite()
            | (pl.col(RATING) < 0)
        ).fill_null(True)
    ).to_series()
    if bad.any():
        n = int(bad.arg_true()[0])
        line = lines.get_column("line")[n]
        line = line if line is None else line[:120]
        raise DataError(
            f"{path}, line {n + 1}: {line!r} is not UserID::MovieID::Rating::Timestamp"
            "; fix or re-download the file"
        )
    return df.select(USER, ITEM, RATING, TIME), {}


def read_netflix(paths: list[Path]) -> Parsed:
    """Netflix Prize: blocks of a 'MovieID:' line then CustomerID,Rating,Date rows, in one
    file per movie (mv_*.txt) or four combined_data_*.txt files. Rows in file order."""
    if not paths:
        raise DataError("no Netflix files given")
    frames = []
    for path in paths:
        if path.stat().st_size == 0:
            raise DataError(f"{path} is empty; the Netflix files are incomplete")
        lines = read_lines(path, "Netflix Prize")
        f = lines.select(
            pl.col("line").str.split_exact(",", 2).struct.unnest(),
            pl.col("line").str.contains(r"^\s*\d+:\s*$").fill_null(False).alias("head"),
        )
        f = f.select(
            pl.col("head"),
            pl.when(pl.col("head"))
            .then(pl.col("field_0").str.strip_chars().str.strip_suffix(":"))
            .cast(pl.Int32, strict=False)
            .forward_fill()
            .alias(ITEM),
            pl.col("field_0").cast(pl.Int32, strict=False).alias(USER),
            pl.col("field_1").cast(pl.Int8, strict=False).alias(RATING),
            pl.col("field_2").is_null().alias("no_date"),
        )
        row_bad = (
            pl.col(USER).is_null()
            | pl.col(RATING).is_null()
            | (pl.col(RATING) < 0)
            | pl.col("no_date")
            | pl.col(ITEM).is_null()
        )
        bad = f.select(
            pl.when(pl.col("head")).then(pl.col(ITEM).is_null()).otherwise(row_bad).fill_null(True)
        ).to_series()
        if bad.any():
            n = int(bad.arg_true()[0])
            text = (lines.get_column("line")[n] or "")[:120]
            raise DataError(
                f"{path}, line {n + 1}: {text!r} is neither a 'MovieID:' "
                "line nor CustomerID,Rating,Date under one; fix or re-obtain the file"
            )
        rows = f.filter(~pl.col("head")).select(USER, ITEM, RATING)
        if rows.height == 0:
            raise DataError(
                f"{path} holds no CustomerID,Rating,Date rows (no rows under any 'MovieID:' "
                "line); the Netflix files are incomplete"
            )
        frames.append(rows)
        del lines, f
    df = pl.concat(frames, rechunk=True) if len(frames) > 1 else frames[0]
    return df, {"n_files": len(paths)}


def read_lastfm(paths: list[Path], names: bool = False) -> Parsed:
    """Last.fm 360K: user sha1 <tab> artist MBID <tab> artist name <tab> plays, no header.

    Known to be dirty: rows without exactly 4 fields, an empty user or artist, or a plays value
    that is not an integer are skipped and counted. Items: the MBID, or 'name:' + artist name
    where the MBID is empty. `names` adds a `name` column: the artist name as written on the row."""
    path = one_file(paths, "usersha1-artmbid-artname-plays.tsv")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; download lastfm-360k again")
    lines = read_lines(path, "Last.fm 360K", lossy=True)
    f = lines.select(pl.col("line").str.split("\t").alias("f")).select(
        pl.col("f").list.len().alias("n"),
        pl.col("f").list.get(0, null_on_oob=True).str.strip_chars().alias(USER),
        pl.col("f").list.get(1, null_on_oob=True).str.strip_chars().alias("mbid"),
        pl.col("f").list.get(2, null_on_oob=True).alias("name"),
        pl.col("f")
        .list.get(3, null_on_oob=True)
        .str.strip_chars()
        .cast(pl.Int64, strict=False)
        .alias(RATING),
    )
    n_lines = f.height
    item = (
        pl.when(pl.col("mbid") != "")
        .then(pl.col("mbid"))
        .when(pl.col("name").str.strip_chars() != "")
        .then(pl.lit("name:") + pl.col("name"))
        .otherwise(None)
    )
    f = f.with_columns(item.alias(ITEM))
    ok = (
        (pl.col("n") == 4)
        & pl.col(USER).is_not_null()
        & (pl.col(USER) != "")
        & pl.col(ITEM).is_not_null()
        & pl.col(RATING).is_not_null()
        & (pl.col(RATING) >= 0)
    )
    keep = [USER, ITEM, pl.col(RATING).cast(pl.Float64)]
    if names:
        keep.append(pl.col("name").str.strip_chars().alias(NAME))
    df = f.filter(ok).select(keep)
    skipped = n_lines - df.height
    if df.height == 0:
        raise DataError(
            f"{path}: none of its {n_lines} lines is user<TAB>mbid<TAB>name<TAB>plays;"
            " is this usersha1-artmbid-artname-plays.tsv?"
        )
    if skipped > 0.01 * n_lines:
        raise DataError(
            f"{path}: {skipped} of {n_lines} lines are malformed (more than 1%); "
            "the file is probably damaged: download lastfm-360k again"
        )
    return df, {"n_lines": n_lines, "n_skipped_malformed": skipped}


def read_pinterest(paths: list[Path]) -> Parsed:
    """NCF Pinterest: pinterest-20.train.rating then pinterest-20.test.rating, each
    user <tab> item <tab> rating <tab> timestamp, no header."""
    order = {"train": 0, "test": 1}
    names = ("user", "item", "rating", "timestamp")
    frames = []
    for path in sorted(paths, key=lambda p: order.get(p.name.split(".")[-2], 2)):
        df = typed_read(
            path, "\t", ("int", "int", "num", "str"), names, False, ("user", "item"), "NCF .rating"
        )
        frames.append(df.rename({"user": USER, "item": ITEM}))
    if not frames:
        raise DataError("no Pinterest files given")
    return pl.concat(frames), {"n_files": len(frames)}


def read_msd(paths: list[Path]) -> Parsed:
    """Taste Profile train_triplets.txt: user <tab> song <tab> play count, no header."""
    path = one_file(paths, "train_triplets.txt")
    names = ("user", "song", "plays")
    df = typed_read(
        path, "\t", ("str", "str", "int"), names, False, names, "MSD triplets", nonneg=("plays",)
    )
    return df.select(
        pl.col("user").alias(USER),
        pl.col("song").alias(ITEM),
        pl.col("plays").cast(pl.Float64).alias(RATING),
    ), {}


PARSERS = {
    "movielens-csv": read_movielens_csv,
    "movielens-dat": read_movielens_dat,
    "netflix": read_netflix,
    "lastfm": read_lastfm,
    "pinterest": read_pinterest,
    "msd": read_msd,
}


# -- item names ----------------------------------------------------------------------------------
# Names are read strictly, like interactions: a malformed names file is a DataError naming the file
# and line (never a silent partial set of names). Every reader returns (item_id, name) rows in file
# order; ids are typed later, like the vocabulary's (vaecf.data.prepare).
def _names_frame(ids: list, names: list) -> pl.DataFrame:
    return pl.DataFrame({ITEM: ids, NAME: names}, schema={ITEM: pl.String, NAME: pl.String})


def read_names_table(
    path: str | os.PathLike, id_col: str, name_col: str, sep: str | None = None
) -> pl.DataFrame:
    """(item_id, name) from a CSV/TSV (header row), JSON or Parquet file with named columns
    (text and JSON may be compressed: `files`)."""
    path = Path(path)
    files.check_file(path, "item names")
    text = files.kind(path) == files.TEXT
    # read as CSV: the interactions' whitespace or '::' is not the names' (names hold spaces)
    sep = sep_for(path, None if sep in SPLIT_SEPS else sep) if text else None
    if sep in SPLIT_SEPS:
        sep = default_sep(path)
    if not text:
        lf, cols = scan_table(path)
    else:
        try:
            lf = pl.scan_csv(files.source(path), separator=sep, infer_schema=False, quote_char='"')
            cols = lf.collect_schema().names()
        except (pl.exceptions.PolarsError, OSError) as e:
            msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise DataError(f"cannot read {path} ({msg}); pass a CSV/TSV names file") from None
    missing = [c for c in (id_col, name_col) if c not in cols]
    if missing:
        raise DataError(
            f"{path}: no column(s) {missing}; the file has columns {cols}. "
            "Pass the right --name-col / --name-id-col"
        )
    try:
        df = lf.select(
            pl.col(id_col).cast(pl.String).alias(ITEM), pl.col(name_col).cast(pl.String).alias(NAME)
        ).collect()
    except pl.exceptions.PolarsError as e:
        where = csv_bad_line(path, sep) if text else None
        where = where or f": {str(e).splitlines()[0][:200]}"
        raise DataError(f"cannot parse {path}{where}; fix the names file") from None
    return df


def read_movielens_movies_csv(path: Path) -> pl.DataFrame:
    """MovieLens movies.csv (ml-20m/25m/32m/latest): header movieId,title,genres; titles quoted
    where they hold a comma. Strict: a bad line is a DataError naming it."""
    import csv

    ids, names = [], []
    with open(path, encoding="utf-8-sig", newline="") as f:
        r = csv.reader(f, strict=True)
        try:
            header = next(r, [])
            if header != ["movieId", "title", "genres"]:
                raise DataError(
                    f"{path}, line 1: header is {','.join(header)[:80]!r}, not "
                    "'movieId,title,genres'; is this a MovieLens movies.csv? Fix or remove it"
                )
            for row in r:
                if len(row) != 3 or not row[0].strip().isdigit() or not row[1].strip():
                    raise DataError(
                        f"{path}, line {r.line_num}: {','.join(row)[:80]!r} is not "
                        "movieId,title,genres; fix, re-download or remove the file"
                    )
                ids.append(row[0].strip())
                names.append(row[1].strip())
        except csv.Error as e:
            raise DataError(f"{path}, line {r.line_num}: {e}; fix or re-download it") from None
        except UnicodeDecodeError:
            raise DataError(
                f"{path}, line {r.line_num + 1}: not valid UTF-8 text; re-download it"
            ) from None
    return _names_frame(ids, names)


def read_movielens_movies_dat(path: Path) -> pl.DataFrame:
    """MovieLens 1M movies.dat: MovieID::Title::Genres, latin-1, no header."""
    ids, names = [], []
    with open(path, encoding="latin-1", newline="") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("::")
            if len(parts) != 3 or not parts[0].strip().isdigit() or not parts[1].strip():
                raise DataError(
                    f"{path}, line {n}: {line[:80]!r} is not MovieID::Title::Genres; "
                    "fix, re-download or remove the file"
                )
            ids.append(parts[0].strip())
            names.append(parts[1].strip())
    return _names_frame(ids, names)


NAMES_READERS = {"movies.csv": read_movielens_movies_csv, "movies.dat": read_movielens_movies_dat}
