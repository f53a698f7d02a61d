"""Batch scoring: top-k recommendations for every user of an interaction file, in bounded memory.

    score_file(rec, "histories.parquet", "user_id", "item_id", out="recs.parquet", k=100)
    score_file(rec, "histories.parquet", None, None, out="recs/")   # Parquet parts + _SUCCESS

The file (any `vaecf prepare csv` reads with a header row; a compressed one is unpacked first,
`data.files.source`) is read lazily with polars, never whole: one pass counts each user's
rows, users are cut in sorted order into chunks of at most `chunk_rows` interactions, and each
chunk is read by a filtered scan (a range of users), its raw ids mapped to the model's items by
a join with the vocabulary, grouped into histories and scored in batches of `batch_users` with
`Recommender.top_k` (batches cut so that their scores take at most `evaluate.SCORE_BUDGET`
bytes). Peak memory: one chunk of interactions and its recommendations, a batch's scores, plus
the per-user row counts. An output file is replaced whole (`onefile`); an output directory is
a table of parts, shared among torchrun's processes and resumed after a kill (`parts`).

Output rows, sorted by user then rank: the user column (as named in the input), rank (1 = best),
item_id, score (the Recommender's: probability for multinomial models), and title where the run
has item names. A user none of whose items the model knows gets the training popularity ranking
(counted as "cold_users"). A history is what the run's own preparation kept: rows rated below
its `--min-rating` are dropped where it had one (`RowFilter`), as `vaecf recommend` sees it.

reading.py   the input read and cut into chunks; a chunk's histories and their top-k rows
onefile.py   one output file, replaced atomically
parts.py     an output directory: Parquet parts, `_SUCCESS`, shared among processes, resumable
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from vaecf.distributed import DistContext
from vaecf.errors import DataError
from vaecf.recommender import Recommender
from vaecf.score.onefile import check_disk, write_file
from vaecf.score.parts import names_a_directory, write_table
from vaecf.score.reading import RowFilter, Scoring, plan_chunks, scan_interactions
from vaecf.storage.safewrite import free_bytes, no_space_error

__all__ = ["RowFilter", "check_disk", "plan_chunks", "scan_interactions", "score_file"]


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
    dist: DistContext | None = None,
) -> dict:
    """Write top-`k` recommendations for every user of `path` to `out`: a .parquet or .csv file,
    or a directory of Parquet parts (a name without either suffix, or ending in "/"); its user
    and item columns `user_col` and `item_col`, or found by name (None); read and filtered as
    `rows` says (default: `RowFilter.of_run(rec)`, the run's own rating threshold, so that a
    user's history is the one `recommend` sees). `dist`: this process's share under torchrun
    (a directory only). `progress(n)` is called after every n users scored. Returns {"users",
    "rows", "chunks", "cold_users", "out"} (a directory: also "parts_scored", "parts_kept");
    cold users had no known item and got the popularity ranking."""
    if chunk_rows < 1 or batch_users < 1:
        raise DataError("chunk_rows and batch_users must be at least 1")
    table, dist = names_a_directory(out), dist or DistContext()
    out = Path(out)
    if dist.enabled and not table:
        raise DataError(f"--out {out}: under torchrun each process writes its share of the "
                        "users as parts: give --out a directory (recs/)")  # fmt: skip
    rows = rows or RowFilter.of_run(rec)
    lf, user_col, item_col = scan_interactions(path, user_col, item_col, rows)
    s = Scoring(rec, lf, user_col, item_col, k, exclude_seen, batch_users, progress)
    (out if table else out.parent).mkdir(parents=True, exist_ok=True)
    try:
        if table:
            return write_table(s, Path(path), asdict(rows), out, chunk_rows, dist)
        return write_file(s, out, chunk_rows)
    except Exception as e:  # polars reports a full disk as its own ComputeError
        disk = out if table else out.parent
        if (full := no_space_error(e, out, free_bytes(disk))) is not None:
            raise full from None
        raise
