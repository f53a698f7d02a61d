"""What every `vaecf score` output shares: the history file read lazily (`scan_interactions`, as
`RowFilter` says), its users cut into chunks of bounded size (`plan_chunks`), and a chunk's
histories read by a filtered scan, mapped to the model's items and scored (`Scoring.chunk`,
`top_k_rows`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from vaecf import rundir
from vaecf.config.settings import spelled
from vaecf.data import files
from vaecf.data.columns import ITEM_NAMES, RATING_NAMES, USER_NAMES, file_columns, guess_column
from vaecf.data.separators import found_sep
from vaecf.data.sources import check_columns, scan_table
from vaecf.data.vocab import INT_ID
from vaecf.errors import DataError
from vaecf.evaluate import SCORE_BUDGET
from vaecf.recommender import Recommender

IDX = "__vaecf_item_index"
BUCKETS = 64  # value ranges counted per chunk of integer user ids: chunks within 1/64 of full
USERS_MARGIN = 0.05  # above HyperLogLog's estimate of the users (its error: ~1-2%)
EXACT_USERS = 100_000  # users counted exactly below this estimate


@dataclass
class RowFilter:
    """How `score_file` reads its input: the text file's separator, header row and column
    names (as `vaecf prepare csv` takes them), and the rows kept as history: those rated at
    least `min_rating` in `rating_col` (found by name where None); `why` names where the
    threshold comes from, for a message."""

    sep: str | None = None
    header: bool = True
    columns: list[str] | str | None = None
    rating_col: str | None = None
    min_rating: float | None = None
    why: str = "the given min_rating"

    @classmethod
    def of_run(cls, rec: Recommender, **kw) -> RowFilter:
        """The run's own preparation's threshold (as `vaecf recommend` sees a history), with
        the reading settings `kw`."""
        kept = rundir.prepared_min_rating(rec.info or {})
        return cls(min_rating=kept, why="the run's own preparation", **kw)


def scan_interactions(
    path: str | os.PathLike,
    user_col: str | None,
    item_col: str | None,
    rows: RowFilter | None = None,
) -> tuple[pl.LazyFrame, str, str]:
    """(the file's user and item columns, without nulls, lazily; their names): those named, or
    found by name as `vaecf prepare csv` finds them (`data.columns.guess_column`), read as
    `rows` says (its separator, header, ratings kept). Any file `vaecf prepare csv` reads."""
    path, rows = Path(path), rows or RowFilter()
    files.check_file(path)
    columns = check_columns(rows.header, rows.columns, files.kind(path) != files.TEXT)
    sep = rows.sep or found_sep(path)
    if columns is None and files.kind(path) == files.TEXT:
        file_columns(path, sep)  # a first line of data: refused with how to name the columns
    lf, names = scan_table(path, sep, rows.header, columns, typed=True)
    user_col = guess_column(names, user_col, USER_NAMES, "user")
    item_col = guess_column(names, item_col, ITEM_NAMES, "item")
    if rows.min_rating is not None:
        try:
            rating = guess_column(names, rows.rating_col, RATING_NAMES, "rating")
        except DataError as e:
            raise DataError(
                f"{e}; {rows.why} keeps ratings of at least {rows.min_rating:g}, so the input "
                f"needs its ratings (or pass {spelled('every_row', python='min_rating=None')} "
                "to take every row as history)"
            ) from None
        lf = lf.filter(pl.col(rating).cast(pl.Float64, strict=False) >= rows.min_rating)
    return lf.select(user_col, item_col).drop_nulls(), user_col, item_col


def cast_ids(col: pl.Expr, given: pl.DataType, vocab: pl.DataType) -> pl.Expr:
    """The input's item ids in the vocabulary's type (what `Vocabulary.index_of` accepts: "42"
    and 42 name the same item); ids that cannot be converted become null (unknown)."""
    if given == vocab:
        return col
    if vocab.is_integer() and given == pl.String:  # the Vocabulary's rule: "42", not " 42"
        col = pl.when(col.str.contains(f"^(?:{INT_ID.pattern})$")).then(col)
    if vocab.is_integer() and given.is_float():  # 7.0 is item 7; 7.5 is no item (not 7)
        col = pl.when(col == col.round(0)).then(col)
    return col.cast(vocab, strict=False)


def runs_of(keys: list, lens: np.ndarray, chunk_rows: int) -> list[tuple]:
    """(first key, last key, rows) of consecutive runs of the sorted `keys` (users, or ranges
    of users), each of at most `chunk_rows` rows (`lens[i]` rows under key i; a key with more
    is a run of its own)."""
    ends, runs, at = np.cumsum(lens), [], 0
    while at < len(lens):  # the next run: as many keys as fit in chunk_rows (at least one)
        base = int(ends[at - 1]) if at else 0
        stop = max(int(np.searchsorted(ends, base + chunk_rows, side="right")), at + 1)
        runs.append((keys[at], keys[stop - 1], int(ends[stop - 1]) - base))
        at = stop
    return runs


def plan_chunks(lf: pl.LazyFrame, user_col: str, chunk_rows: int) -> tuple[list[tuple], int]:
    """(chunks: (first user, last user, rows) over the sorted users, each of at most
    `chunk_rows` interactions (a user with more is a chunk of its own); the number of users, or
    an estimate of it above the true one by at most a few percent).

    Integer ids, in memory that does not grow with the users: their range cut into BUCKETS
    buckets a chunk by value, each bucket's rows and first and last user counted (one pass),
    consecutive buckets joined into chunks; the users counted by HyperLogLog (exactly below
    EXACT_USERS). Other ids: each user's rows counted (memory grows with the users: ~120 bytes
    each)."""
    if not lf.collect_schema()[user_col].is_integer():
        counts = lf.group_by(user_col).agg(pl.len().alias("n")).sort(user_col).collect()
        users = counts.get_column(user_col).to_list()
        return runs_of(users, counts.get_column("n").to_numpy(), chunk_rows), counts.height
    u = pl.col(user_col)
    top = lf.select(pl.len().alias("rows"), u.min().alias("lo"), u.max().alias("hi"),
                    u.approx_n_unique().alias("users"))  # fmt: skip
    # Polars' streaming engine: its in-memory one held the input's columns (Polars 1.33:
    # ~1 GiB at 30M rows; benchmarks/README.md, "Batch scoring")
    top = top.collect(engine="streaming").row(0, named=True)
    if not top["rows"]:
        return [], 0
    ranges = value_ranges(lf, u, top["lo"], top["hi"], top["rows"], chunk_rows)
    runs = runs_of(list(range(len(ranges))), np.array([r[2] for r in ranges]), chunk_rows)
    n_users = int(top["users"] * (1 + USERS_MARGIN))
    if n_users < EXACT_USERS:  # few enough to count exactly in little memory
        n_users = lf.select(u.n_unique()).collect(engine="streaming").item()
    return [(ranges[a][0], ranges[b][1], n) for a, b, n in runs], min(n_users, top["rows"])


def value_ranges(lf: pl.LazyFrame, u: pl.Expr, lo, hi, rows: int, chunk_rows: int) -> list:
    """(first user, last user, rows) of ranges of integer ids lo..hi, in order, each of at most
    `chunk_rows` rows unless it holds one user: BUCKETS buckets a chunk's worth of rows by
    value, and a bucket still too full cut again within its own first..last."""
    n_buckets = BUCKETS * (rows // chunk_rows + 1)
    scale = n_buckets / (float(hi) - float(lo) + 1.0)
    # in floats (no overflow at any ids); monotonic, so each bucket is a range of values
    bucket = ((u.cast(pl.Float64) - float(lo)) * scale).floor().cast(pl.Int64)
    per = (
        lf.filter(u.is_between(lo, hi))
        .group_by(bucket.alias("b"))
        .agg(pl.len().alias("n"), u.min().alias("first"), u.max().alias("last"))
        .sort("b")
        .collect(engine="streaming")
    )
    out = []
    for first, last, n in per.select("first", "last", "n").iter_rows():
        if n > chunk_rows and first != last and per.height > 1:
            out.extend(value_ranges(lf, u, first, last, n, chunk_rows))
        else:
            out.append((first, last, n))
    return out


@dataclass
class Scoring:
    """One scoring's settings and what every chunk reads with: the recommender, the lazily
    read input and its columns, k, and the batch of users scored at once."""

    rec: Recommender
    lf: pl.LazyFrame
    user_col: str
    item_col: str
    k: int
    exclude_seen: bool
    batch_users: int
    progress: Callable[[int], None] | None = None

    def __post_init__(self):
        self.schema = self.lf.collect_schema()  # a CSV's is inferred from its rows: once
        # a batch's scores are (users, n_items) floats: as evaluation, at most SCORE_BUDGET
        self.batch_users = max(1, min(self.batch_users, SCORE_BUDGET // (4 * len(self.rec.items))))
        self.vocab = pl.LazyFrame(
            {self.item_col: self.rec.items.ids, IDX: range(len(self.rec.items))}
        )

    def empty_schema(self) -> dict:
        """The output's columns and types (what a table with no rows holds)."""
        cols = {self.user_col: self.schema[self.user_col], "rank": pl.Int32}
        cols.update({"item_id": self.rec.items.ids.dtype, "score": pl.Float32})
        if self.rec.names is not None:
            cols["title"] = pl.String
        return cols

    def chunk(self, lo, hi) -> tuple[pl.DataFrame, int, int]:
        """(the top-k rows of the users lo..hi, how many users, how many of them cold)."""
        as_vocab = cast_ids(pl.col(self.item_col), self.schema[self.item_col],
                            self.rec.items.ids.dtype)  # fmt: skip
        hist = (  # each user's known items as sorted distinct indices; unknown ids dropped
            self.lf.filter(pl.col(self.user_col).is_between(pl.lit(lo), pl.lit(hi), closed="both"))
            .with_columns(as_vocab)
            .join(self.vocab, on=self.item_col, how="left")
            .group_by(self.user_col)
            .agg(pl.col(IDX).drop_nulls().unique().sort())
            .sort(self.user_col)
            .collect(engine="streaming")
        )
        rows, cold = top_k_rows(self, hist)
        if not rows.height:
            rows = pl.DataFrame(schema=self.empty_schema())
        return rows, hist.height, cold


def top_k_rows(s: Scoring, hist: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """(user, rank, item_id, score[, title]) rows of one chunk's users (`hist`: each user's
    sorted item indices), scored `s.batch_users` at a time; and how many of them were cold."""
    rec, users = s.rec, hist.get_column(s.user_col)
    lens = hist.get_column(IDX).list.len().to_numpy().astype(np.int64)
    flat = hist.get_column(IDX).explode().drop_nulls().to_numpy().astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)])
    frames, n_cold = [], 0
    for b in range(0, len(users), s.batch_users):
        e = min(b + s.batch_users, len(users))
        batch = rec.batch_of(
            torch.from_numpy(flat[starts[b] : starts[e]]), torch.from_numpy(lens[b:e])
        )
        idx, scores, n, cold = rec.top_k(batch, s.k, exclude_history=s.exclude_seen)
        n_cold += int(cold.sum())
        valid = np.arange(idx.shape[1])[None, :] < n[:, None]
        ranks = np.broadcast_to(np.arange(1, idx.shape[1] + 1, dtype=np.int32), idx.shape)
        ids = rec.items.ids.gather(idx[valid])
        cols = {
            s.user_col: users.slice(b, e - b).gather(np.repeat(np.arange(e - b), n)),
            "rank": ranks[valid],
            "item_id": ids,
            "score": scores[valid].astype(np.float32),
        }
        if rec.names is not None:  # the run's item names: a title column, as recommend shows
            cols["title"] = pl.Series(rec.titles(ids.to_list()), dtype=pl.String)
        frames.append(pl.DataFrame(cols))
        if s.progress is not None:
            s.progress(e - b)
    return (pl.concat(frames) if frames else pl.DataFrame()), n_cold
