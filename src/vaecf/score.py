"""Batch scoring: top-k recommendations for every user of an interaction file, in bounded memory.

    score_file(run, "histories.parquet", "user_id", "item_id", k=100, out="recs.parquet")

The file (any `vaecf prepare csv` reads with a header row; a compressed one is unpacked first,
`data.files.source`) is read lazily with polars, never whole: one pass counts each user's
rows, users are cut in sorted order into chunks of at most `chunk_rows` interactions, and each
chunk is read by a filtered scan (a range of users), its raw ids mapped to the model's items by
a join with the vocabulary, grouped into histories and scored in batches of `batch_users` with
`Recommender.top_k`. Every chunk's rows go to a part file
in a temp directory beside `out`; the parts are then streamed into `out` through a temp file and
a rename (mode as `open` would give it, fsynced first), so `out` is either the previous file or
the complete new one. Before scoring, the disk space the parts and `out` may take is checked
against what `out`'s disk has free (refused with the figures), and batches are cut so that
their scores take at most `evaluate.SCORE_BUDGET` bytes. One `score` writes `out` at a time (a
lock beside it), and it first removes what a killed run left there. Peak memory: one chunk of
interactions and its recommendations, a batch's scores, plus the per-user row counts.

Output rows, sorted by user then rank: the user column (as named in the input), rank (1 = best),
item_id, score (the Recommender's: probability for multinomial models), and title where the run
has item names. A user none of whose items the model knows gets the training popularity ranking
(counted as "cold_users"). A history is what the run's own preparation kept: rows rated below
its `--min-rating` are dropped where it had one (`RowFilter`), as `vaecf recommend` sees it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
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
from vaecf.errors import DataError, WriteError
from vaecf.evaluate import SCORE_BUDGET
from vaecf.memory import gib
from vaecf.recommender import Recommender
from vaecf.storage.safewrite import (
    current_umask,
    free_bytes,
    fsync_dir,
    no_space_error,
    sweep_temps,
)
from vaecf.storage.writelock import writer_lock

IDX = "__vaecf_item_index"
# bytes per output row, with room to spare (measured on ml-latest-small at k=100: 5.0 in
# Parquet, 22.4 in CSV): each part (Parquet) and the output are on disk together at the end
PART_ROW_BYTES = 10
CSV_ROW_BYTES = 40


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


def _cast_ids(col: pl.Expr, given: pl.DataType, vocab: pl.DataType) -> pl.Expr:
    """The input's item ids in the vocabulary's type (what `Vocabulary.index_of` accepts: "42"
    and 42 name the same item); ids that cannot be converted become null (unknown)."""
    if given == vocab:
        return col
    if vocab.is_integer() and given == pl.String:  # the Vocabulary's rule: "42", not " 42"
        col = pl.when(col.str.contains(f"^(?:{INT_ID.pattern})$")).then(col)
    if vocab.is_integer() and given.is_float():  # 7.0 is item 7; 7.5 is no item (not 7)
        col = pl.when(col == col.round(0)).then(col)
    return col.cast(vocab, strict=False)


def user_chunks(counts: pl.DataFrame, user_col: str, chunk_rows: int) -> list[tuple]:
    """(first user, last user, n_users) ranges over the sorted users, each of at most
    `chunk_rows` interactions (a user with more is a chunk of its own)."""
    chunks, start, rows = [], 0, 0
    users = counts.get_column(user_col).to_list()
    lens = counts.get_column("n").to_list()
    for i, n in enumerate(lens):
        if rows and rows + n > chunk_rows:
            chunks.append((users[start], users[i - 1], i - start))
            start, rows = i, 0
        rows += n
    if users:
        chunks.append((users[start], users[-1], len(users) - start))
    return chunks


def check_disk(out: Path, n_users: int, k: int) -> int:
    """Refuse, before anything is scored, when the parts and `out` (up to n_users x k rows)
    may not fit on `out`'s disk; returns the bytes it expects to need."""
    per_row = PART_ROW_BYTES + (CSV_ROW_BYTES if out.suffix.lower() == ".csv" else PART_ROW_BYTES)
    need = n_users * k * per_row
    free = free_bytes(out.parent)
    if free is not None and need > free:
        raise WriteError(
            f"no space for {out}: scoring {n_users:,} users at k={k} writes up to "
            f"{n_users * k:,} rows, about {gib(need)} (the parts, then the file), but "
            f"{out.parent} has {gib(free)} free; write --out to a disk with more space, lower "
            "-k, or score the users in several files"
        )
    return need


def score_file(
    rec: Recommender,
    path: str | os.PathLike,
    user_col: str | None,
    item_col: str | None,
    out: str | os.PathLike,
    k: int = 100,
    exclude_seen: bool = True,
    chunk_rows: int = 2_000_000,
    batch_users: int = 1024,
    progress: Callable[[int], None] | None = None,
    rows: RowFilter | None = None,
) -> dict:
    """Write top-`k` recommendations for every user of `path` to `out` (.parquet or .csv);
    its user and item columns `user_col` and `item_col`, or found by name (None); read and
    filtered as `rows` says (default: `RowFilter.of_run(rec)`, the run's own rating threshold,
    so that a user's history is the one `recommend` sees).
    `progress(n)` is called after every n users scored. Returns {"users", "rows", "chunks",
    "cold_users", "out"}: cold users had no known item and got the popularity ranking."""
    if chunk_rows < 1 or batch_users < 1:
        raise DataError("chunk_rows and batch_users must be at least 1")
    out = Path(out)
    if out.suffix.lower() not in (".parquet", ".csv"):
        raise DataError(f"--out {out}: give a .parquet or .csv file name")
    rows = rows or RowFilter.of_run(rec)
    lf, user_col, item_col = scan_interactions(path, user_col, item_col, rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    with writer_lock(out, "vaecf score"):
        sweep_temps(out)  # what a killed run left beside `out` (its parts, its temp file)
        try:
            return _score_file(rec, lf, user_col, item_col, out, k, exclude_seen, chunk_rows,
                               batch_users, progress)  # fmt: skip
        except Exception as e:  # polars reports a full disk as its own ComputeError
            if (full := no_space_error(e, out, free_bytes(out.parent))) is not None:
                raise full from None
            raise


def _score_file(
    rec, lf, user_col, item_col, out, k, exclude_seen, chunk_rows, batch_users, progress
) -> dict:
    schema = lf.collect_schema()  # a CSV's is inferred from its rows: resolve it once
    counts = lf.group_by(user_col).agg(pl.len().alias("n")).sort(user_col).collect()
    check_disk(out, counts.height, min(k, len(rec.items)))
    chunks = user_chunks(counts, user_col, chunk_rows)
    del counts
    # a batch's scores are (users, n_items) floats: as evaluation, at most SCORE_BUDGET bytes
    batch_users = max(1, min(batch_users, SCORE_BUDGET // (4 * len(rec.items))))
    parts_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".parts.tmp", dir=out.parent))
    n_users = n_rows = n_cold = 0
    try:
        vocab = pl.LazyFrame({item_col: rec.items.ids, IDX: range(len(rec.items))})
        as_vocab = _cast_ids(pl.col(item_col), schema[item_col], rec.items.ids.dtype)
        for c, (lo, hi, _) in enumerate(chunks):
            hist = (  # each user's known items as sorted distinct indices; unknown ids dropped
                lf.filter(pl.col(user_col).is_between(pl.lit(lo), pl.lit(hi), closed="both"))
                .with_columns(as_vocab)
                .join(vocab, on=item_col, how="left")
                .group_by(user_col)
                .agg(pl.col(IDX).drop_nulls().unique().sort())
                .sort(user_col)
                .collect()
            )
            part, cold = _top_k_rows(rec, hist, user_col, k, exclude_seen, batch_users, progress)
            if part.height:
                part.write_parquet(parts_dir / f"{c:06d}.parquet")
            n_users, n_rows, n_cold = n_users + hist.height, n_rows + part.height, n_cold + cold
        empty = {user_col: schema[user_col], "rank": pl.Int32}
        empty.update({"item_id": rec.items.ids.dtype, "score": pl.Float32})
        if rec.names is not None:
            empty["title"] = pl.String
        _merge_parts(sorted(parts_dir.glob("*.parquet")), out, empty)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
    return {
        "users": n_users,
        "rows": n_rows,
        "chunks": len(chunks),
        "cold_users": n_cold,
        "out": str(out),
    }


def _top_k_rows(rec, hist, user_col, k, exclude_seen, batch_users, progress):
    """(user, rank, item_id, score) rows of one chunk's users (`hist`: each user's sorted item
    indices), scored `batch_users` at a time; and how many of them were cold."""
    users = hist.get_column(user_col)
    lens = hist.get_column(IDX).list.len().to_numpy().astype(np.int64)
    flat = hist.get_column(IDX).explode().drop_nulls().to_numpy().astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)])
    frames, n_cold = [], 0
    for b in range(0, len(users), batch_users):
        e = min(b + batch_users, len(users))
        batch = rec.batch_of(
            torch.from_numpy(flat[starts[b] : starts[e]]), torch.from_numpy(lens[b:e])
        )
        idx, scores, n, cold = rec.top_k(batch, k, exclude_history=exclude_seen)
        n_cold += int(cold.sum())
        valid = np.arange(idx.shape[1])[None, :] < n[:, None]
        ranks = np.broadcast_to(np.arange(1, idx.shape[1] + 1, dtype=np.int32), idx.shape)
        ids = rec.items.ids.gather(idx[valid])
        cols = {
            user_col: users.slice(b, e - b).gather(np.repeat(np.arange(e - b), n)),
            "rank": ranks[valid],
            "item_id": ids,
            "score": scores[valid].astype(np.float32),
        }
        if rec.names is not None:  # the run's item names: a title column, as recommend shows
            cols["title"] = pl.Series(rec.titles(ids.to_list()), dtype=pl.String)
        frames.append(pl.DataFrame(cols))
        if progress is not None:
            progress(e - b)
    return (pl.concat(frames) if frames else pl.DataFrame()), n_cold


def _merge_parts(parts: list[Path], out: Path, empty_schema: dict) -> None:
    """The parts' rows into `out` (Parquet or CSV by its suffix), atomically and durably: a
    temporary file beside it, synced, then renamed. No parts: the columns of `empty_schema`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        merged = pl.scan_parquet(parts) if parts else pl.LazyFrame(schema=empty_schema)
        if out.suffix.lower() == ".parquet":
            merged.sink_parquet(tmp)
        else:
            merged.sink_csv(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())  # what open(out, "w") would have given
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())  # on disk before it takes the name
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
