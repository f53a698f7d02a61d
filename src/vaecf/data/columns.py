"""Which columns of an interactions file hold the users, the items and the ratings: those named
(--user-col, --item-col, --rating-col), else found by their names as public datasets spell them
(`guess_column`), from the file's header row (`file_columns`) or a header-less file's
--columns. `vaecf prepare csv`, `compare --data`, `score` and `vaecf.fit` all find them here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from vaecf.config.settings import READER, spelled
from vaecf.data import files
from vaecf.data.separators import sep_for, sep_hint, sep_name, split_fields
from vaecf.data.sources import scan_table
from vaecf.errors import DataError

# id and rating columns found by name where none is named (lower case, without separators), as
# public datasets spell them: MovieLens userId/movieId, Amazon reviewerID/asin, H&M
# customer_id/article_id, Yelp business_id, Goodreads book_id, Last.fm artist, the Million Song
# Dataset's song; each with or without "id"
_USERS = ("user", "customer", "visitor", "reviewer", "member", "client", "account")
_ITEMS = ("item", "movie", "product", "track", "article", "business", "book", "artist", "song")
_ITEMS += ("video", "post")
USER_NAMES = (*(n for u in _USERS for n in (u, u + "id")), "uid")  # in order of preference
ITEM_NAMES = (*(n for i in _ITEMS for n in (i, i + "id")), "iid", "sku", "asin", "isbn")
RATING_NAMES = ("rating", "ratings", "score", "stars", "overall", "value")  # with min_rating
# time columns, for the time protocols: MovieLens timestamp, Amazon unixReviewTime, H&M t_dat
TIME_NAMES = ("timestamp", "time", "datetime", "date", "ts", "eventtime", "unixreviewtime")
TIME_NAMES += ("createdat", "tdat")


def resolve_columns(
    path: Path, sep: str | None, user_col, item_col, rating_col, columns, want_rating=False
) -> tuple[str, str, str | None]:
    """--user-col/--item-col/--rating-col, each not given found by name (`guess_column`) among
    the file's columns: its header row's, or a header-less file's --columns (there a column
    named rating is the ratings). The ratings are looked for where `want_rating` (a
    --min-rating to apply)."""
    rating_col = rating_col or ("rating" if "rating" in (columns or ()) else None)
    given = user_col and item_col and (rating_col or not want_rating)
    if given and columns is None and files.kind(path) == files.JSON:
        return user_col, item_col, rating_col  # a record may lack a field: read_table checks
    # checked here, before the output is looked at: a wrong name is the error to see first
    names = file_columns(path, sep) if columns is None else list(columns)
    user_col = guess_column(names, user_col, USER_NAMES, "user")
    item_col = guess_column(names, item_col, ITEM_NAMES, "item")
    if rating_col is not None or want_rating:
        rating_col = guess_column(names, rating_col, RATING_NAMES, "rating")
    return user_col, item_col, rating_col


def find_time_column(path: Path, sep: str | None, time_col, columns, protocol: str) -> str | None:
    """A file's time column under a time protocol (`pick_time_column`); None under another."""
    from vaecf.data.preprocess import TIME_PROTOCOLS

    if protocol not in TIME_PROTOCOLS:
        return pick_time_column([], time_col, protocol, str(path))
    names = file_columns(path, sep) if columns is None else list(columns)
    return pick_time_column(names, time_col, protocol, str(path))


def pick_time_column(names: list[str], time_col, protocol: str, where: str) -> str | None:
    """Under a time protocol: `time_col`, checked to be one of `names`, else the one named like
    a time (`TIME_NAMES`), a DataError in one line naming what was looked for where there is
    none. Under another protocol: None (and `time_col` refused: it would do nothing)."""
    from vaecf.data.preprocess import TIME_PROTOCOLS

    if protocol not in TIME_PROTOCOLS:
        if time_col is not None:
            raise DataError(
                f"{spelled('time_col')} orders the time protocols only: add "
                f"{spelled('protocol', 'temporal')} or drop it"
            )
        return None
    if time_col is not None:
        return guess_column(names, time_col, (), "time")
    try:
        return guess_column(names, None, TIME_NAMES, "time")
    except DataError:
        raise DataError(
            f"the {protocol} protocol orders interactions by time, and {where} has no column "
            f"named timestamp, time, datetime, date or ts (its columns: {names}); name the "
            f"one that holds the times with {spelled('time_col')}"
        ) from None


def found_by_name(
    given: dict, used: dict, sep: str | None = None, min_rating: float | None = None
) -> str:
    """A line naming the columns of `used` ({"user": ..., "item": ..., "rating": ...}, as a
    prepared dataset's manifest records them) that were found by name, not `given`, the
    separator `sep` found in the file (`separators.found_sep`), and, where a rating column is
    there but no `min_rating` reads it, that every row counted; "" if none of these."""
    found = [
        f"{w}s {used[w]!r}" for w in ("user", "item", "rating") if used.get(w) and not given.get(w)
    ]
    said = [f"fields separated by {sep_name(sep)}"] if sep else []
    said += [f"columns found by name: {', '.join(found)}"] if found else []
    if used.get("rating") and min_rating is None:
        said.append(
            f"the ratings in {used['rating']!r} were not read: every row is a positive "
            f"interaction, its rating whatever it is; to keep only high ratings, prepare with "
            f"{spelled('min_rating', 4)} (or the threshold of your scale)"
        )
    return "; ".join(said)


def guess_column(columns: list[str], given: str | None, known: tuple[str, ...], what: str) -> str:
    """`given`, checked to be one of `columns`; else the column whose name, in lower case
    without separators, comes first in `known` (user_id before customer_id)."""
    flag = spelled(f"{what}_col")
    if given is not None:
        if given not in columns:
            raise DataError(f"{flag} {given!r} is not a column; the columns: {columns}")
        return given
    plain = {re.sub(r"[^a-z0-9]", "", c.lower()): c for c in reversed(columns)}
    for name in known:
        if name in plain:
            return plain[name]
    raise DataError(f"say which column holds the {what}s: {flag} (the columns: {columns})")


def file_columns(path: Path, sep: str | None) -> list[str]:
    """The column names in a file's header row (JSON Lines: its first record's fields; Parquet
    and a JSON array: their schema's); a first line of numbers is refused with how to name the
    columns of a file that has no header row."""
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; pass a file with a header row and interactions")
    if files.kind(path) == files.JSON and (record := _first_record(path)) is not None:
        return list(record)  # not the whole file's schema: a JSON Lines dump may be gigabytes
    if files.kind(path) != files.TEXT:
        return scan_table(path)[1]
    first = files.first_line(path)
    s = sep_for(path, sep)  # as read_table will read it
    names = [n.strip().strip('"') for n in split_fields(first, s)]
    if len(names) == 1 and (hint := sep_hint(first, s)).startswith("; its fields"):
        if all(map(_number, fields := re.split(r"[\t;| ]+|::", first.strip()))):
            hint += f", and {_name_them(len(fields))}"
        raise DataError(f"{path}'s first line, {first.strip()!r}, reads as one column{hint}")
    if names and all(map(_number, names)):
        raise DataError(
            f"{path} has no header row (its first line, {first.strip()!r}, is data): "
            + _name_them(len(names))
        )
    return names


def _first_record(path: Path) -> dict | None:
    """A JSON Lines file's first record; None where its first line is not one (an array)."""
    try:
        record = json.loads(files.first_line(path))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _name_them(n_fields: int) -> str:
    """How to name a header-less file's `n_fields` columns in order (an example to adapt)."""
    names = ["user", "item", "rating", "timestamp"][: max(n_fields, 2)]
    names += [f"field{k}" for k in range(len(names) + 1, n_fields + 1)]
    quoted = ", ".join(f'"{n}"' for n in names)
    if READER.get() == "cli":
        return f"name its columns in order, e.g. --no-header --columns {','.join(names)}"
    return f"name its columns in order, e.g. header=False, columns=[{quoted}]"


def _number(text: str) -> bool:
    return re.fullmatch(r"[-+]?[0-9.]+(e[-+]?[0-9]+)?", text, re.I) is not None
