"""`vaecf score --out recs.parquet` (or .csv): the whole table in one file, replaced atomically.

Every chunk's rows go to a part file in a temp directory beside `out`; the parts are then
streamed into `out` through a temp file and a rename (mode as `open` would give it, fsynced
first), so `out` is either the previous file or the complete new one. Before scoring, the disk
space the parts and `out` may take is checked against what `out`'s disk has free (refused with
the figures). One `score` writes `out` at a time (a lock beside it), and it first removes what
a killed run left there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import polars as pl

from vaecf.errors import WriteError
from vaecf.memory import gib
from vaecf.score.reading import Scoring, plan_chunks
from vaecf.storage.safewrite import current_umask, free_bytes, fsync_dir, sweep_temps
from vaecf.storage.writelock import writer_lock

# bytes per output row, with room to spare (measured on ml-latest-small at k=100: 5.0 in
# Parquet, 22.4 in CSV): each part (Parquet) and the output are on disk together at the end
PART_ROW_BYTES = 10
CSV_ROW_BYTES = 40


def check_disk(out: Path, n_users: int, k: int, table: bool = False) -> int:
    """Refuse, before anything is scored, when the output (up to n_users x k rows) may not fit
    on its disk: a file's parts and then the file beside them, or (`table`) the parts in the
    directory `out`; returns the bytes it expects to need."""
    per_row = PART_ROW_BYTES
    if not table:
        per_row += CSV_ROW_BYTES if out.suffix.lower() == ".csv" else PART_ROW_BYTES
    need = n_users * k * per_row
    disk = out if table else out.parent
    free = free_bytes(disk)
    if free is not None and need > free:
        what = "its parts" if table else "the parts, then the file"
        split = "" if table else ", or score the users in several files"
        raise WriteError(
            f"no space for {out}: scoring {n_users:,} users at k={k} writes up to "
            f"{n_users * k:,} rows, about {gib(need)} ({what}), but "
            f"{disk} has {gib(free)} free; write --out to a disk with more space or lower "
            f"-k{split}"
        )
    return need


def write_file(s: Scoring, out: Path, chunk_rows: int) -> dict:
    """The whole table of `s` into the file `out`, as the module says."""
    with writer_lock(out, "vaecf score"):
        sweep_temps(out)  # what a killed run left beside `out` (its parts, its temp file)
        chunks, n = plan_chunks(s.lf, s.user_col, chunk_rows)
        check_disk(out, n, min(s.k, len(s.rec.items)))
        parts = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".parts.tmp", dir=out.parent))
        n_users = n_rows = n_cold = 0
        try:
            for c, (lo, hi, _) in enumerate(chunks):
                rows, users, cold = s.chunk(lo, hi)
                if rows.height:
                    rows.write_parquet(parts / f"{c:06d}.parquet")
                n_users, n_rows, n_cold = n_users + users, n_rows + rows.height, n_cold + cold
            merge_parts(sorted(parts.glob("*.parquet")), out, s.empty_schema())
        finally:
            shutil.rmtree(parts, ignore_errors=True)
    return {"users": n_users, "rows": n_rows, "chunks": len(chunks), "cold_users": n_cold,
            "out": str(out)}  # fmt: skip


def merge_parts(parts: list[Path], out: Path, empty_schema: dict) -> None:
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
