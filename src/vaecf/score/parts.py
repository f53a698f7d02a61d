"""`vaecf score --out DIR/`: the table as Parquet parts, shared among processes, resumable.

The users, sorted, are cut into chunks (at most `chunk_rows` interactions each); chunk c is
written as `DIR/part-0000c.parquet`, atomically (a temp file beside it, fsynced, renamed), by
the process of rank c mod world (`torchrun ... vaecf score`: every process runs the same
command; one process: rank 0 of 1). Rank 0 plans: it counts the users, cuts the chunks and
writes the plan (`_vaecf_score.json`: the run, its precision, k, the input and the chunks); the
plan goes to every rank. Once every rank has written its parts, rank 0 writes `_SUCCESS`
(JSON: each part and its rows, as Spark and Hadoop mark a complete table; readers skip files
starting with `_` or `.`).

Run again (after a kill, a full disk, any rank lost), the same command keeps each part that
reads back whole and holds what its chunk should (its users within the chunk's range, at most
k rows each: verified, not trusted) and scores only the rest; its answer equals an
uninterrupted run's. A directory holding another scoring's plan (another run, precision, k,
input or chunking) is refused in one line; so is a non-empty directory that holds no plan.
On several machines `DIR` is a shared file system (as a Spark table's), or each machine keeps
the parts of its ranks and rank 0's `_SUCCESS` lists them all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl

from vaecf.distributed import DistContext
from vaecf.errors import DataError, WriteError
from vaecf.score.onefile import check_disk
from vaecf.score.reading import Scoring, plan_chunks
from vaecf.storage.checkpoint import footer_digest
from vaecf.storage.safewrite import atomic_file, sweep_temps, write_json
from vaecf.storage.writelock import writer_lock

PLAN = "_vaecf_score.json"
SUCCESS = "_SUCCESS"
PLAN_FORMAT = 1


def part_name(c: int) -> str:
    return f"part-{c:05d}.parquet"


def names_a_directory(out: str | os.PathLike) -> bool:
    """An output path that names a directory: an existing one, one written with a trailing
    slash, or one whose name does not end in .parquet or .csv."""
    text = os.fspath(out)
    if text.endswith(("/", os.sep)) or Path(text).is_dir():
        return True
    return Path(text).suffix.lower() not in (".parquet", ".csv")


def planned_precision(out: str | os.PathLike) -> str | None:
    """The precision the plan in directory `out` was scored in; None where there is none."""
    try:
        return json.loads((Path(out) / PLAN).read_text()).get("precision")
    except (OSError, ValueError, AttributeError):
        return None


def scoring_plan(s: Scoring, path: Path, rows: dict, chunk_rows: int) -> dict:
    """What a directory's parts are the answer to (compared on every run into it): the run (its
    weights' digest), the precision, k, what counts as history, the input, and the chunks."""
    rec = s.rec
    best = Path(rec.source) / "best.pt" if rec.source else None
    weights = (footer_digest(best) if best else None) or rec.source  # an older run: its place
    chunks, n_users = plan_chunks(s.lf, s.user_col, chunk_rows)  # users: maybe an estimate
    plan = {
        "format": PLAN_FORMAT,
        "run": weights,
        "precision": rec.precision,
        "k": s.k,
        "exclude_seen": s.exclude_seen,
        "input": {
            "name": path.name,
            "bytes": path.stat().st_size,
            "user_col": s.user_col,
            "item_col": s.item_col,
            "rows": rows,
        },
        "chunk_rows": chunk_rows,
        "users": n_users,
        "chunks": [[lo, hi, n] for lo, hi, n in chunks],
    }
    return json.loads(json.dumps(plan, default=str))  # as it reads back from the file


def check_plan(out: Path, plan: dict) -> None:
    """Refuse a directory that holds another scoring (one line naming what differs) or that is
    not empty and holds no plan; write the plan where there is none."""
    there = out / PLAN
    if not there.is_file():
        if any(not p.name.startswith(".") for p in out.iterdir()):
            raise DataError(f"{out} is not empty and holds no vaecf score output ({PLAN}): "
                            "give --out a new or empty directory")  # fmt: skip
        write_json(there, plan)
        return
    try:
        old = json.loads(there.read_text())
    except (OSError, ValueError):
        old = {}
    differ = [k for k in plan if old.get(k) != plan[k]]
    if differ:
        said = ", ".join(
            f"{k} {old.get(k)!r} there, {plan[k]!r} now"
            if k in ("k", "precision", "chunk_rows")
            else k
            for k in differ
        )
        raise DataError(f"{out} holds the parts of another scoring ({said}): give --out a new "
                        "directory, or remove it to score again")  # fmt: skip


def kept_rows(path: Path, lo, hi, n_rows: int, k: int, schema: dict) -> tuple[int, int] | None:
    """(rows, users) of a part already written, where it reads back whole and holds what its
    chunk should (its columns; users within lo..hi, no more than the chunk's `n_rows`
    interactions, at most k rows each); else None."""
    if not path.is_file():
        return None
    try:
        df = pl.read_parquet(path)
    except Exception:  # damaged: scored again
        return None
    if dict(df.schema) != schema:
        return None
    users = df.get_column(next(iter(schema)))
    n_users = users.n_unique() if df.height else 0
    if df.height and (
        users.min() < lo or users.max() > hi or n_users > n_rows
        or df.height > n_users * k or df.get_column("rank").max() > k
    ):  # fmt: skip
        return None
    return df.height, n_users


def write_table(
    s: Scoring, path: Path, rows: dict, out: Path, chunk_rows: int, ctx: DistContext
) -> dict:
    """The table of `s` as parts in the directory `out`, this rank's share of them, as the
    module says; returns the counts (on rank 0: the whole table's)."""
    out.mkdir(parents=True, exist_ok=True)
    with writer_lock(out / f"rank-{ctx.rank}-of-{ctx.world}", "vaecf score"):
        plan, err = None, None
        if ctx.is_main:
            try:
                plan = scoring_plan(s, path, rows, chunk_rows)
                check_plan(out, plan)
            except (DataError, WriteError, OSError) as e:
                err = (type(e).__name__, str(e))
        plan, err = ctx.from_main((plan, err))
        if err is not None:
            raise (WriteError if err[0] == "WriteError" else DataError)(err[1])
        if not ctx.is_main:
            check_plan(out, plan)  # this machine's view of `out`, where it is not shared
        mine = _score_share(s, plan, out, ctx)
    every = ctx.gather(mine)
    parts = sorted((p for share in every for p in share["parts"]), key=lambda p: p["name"])
    rows, users = sum(p["rows"] for p in parts), sum(p["users"] for p in parts)
    if ctx.is_main:
        write_json(out / SUCCESS, {"parts": parts, "rows": rows, "users": users})
    ctx.barrier()
    total = {key: sum(share[key] for share in every) for key in ("scored", "kept", "cold_users")}
    return {"users": users, "rows": rows, "chunks": len(plan["chunks"]),
            "parts_scored": total["scored"], "parts_kept": total["kept"],
            "cold_users": total["cold_users"], "out": str(out)}  # fmt: skip


def _score_share(s: Scoring, plan: dict, out: Path, ctx: DistContext) -> dict:
    """This rank's chunks: each kept where its part verifies, else scored and written."""
    schema = s.empty_schema()
    mine = [c for c in range(len(plan["chunks"])) if c % ctx.world == ctx.rank]
    for c in mine:
        sweep_temps(out / part_name(c))  # what a killed write of this rank's part left
    todo = [c for c in mine if not (out / part_name(c)).is_file()]
    share = sum(plan["chunks"][c][2] for c in todo) / max(1, sum(c[2] for c in plan["chunks"]))
    check_disk(out, round(plan["users"] * share), min(s.k, len(s.rec.items)), table=True)
    parts, scored, kept, cold = [], 0, 0, 0
    for c in mine:
        lo, hi, n = plan["chunks"][c]
        path = out / part_name(c)
        got = kept_rows(path, lo, hi, n, s.k, schema)
        if got is None:
            rows, users, n_cold = s.chunk(lo, hi)
            with atomic_file(path) as f:
                rows.write_parquet(f)
            got, scored, cold = (rows.height, users), scored + 1, cold + n_cold
        else:
            kept += 1
            if s.progress is not None:
                s.progress(got[1])
        parts.append({"name": path.name, "rows": got[0], "users": got[1]})
    return {"parts": parts, "scored": scored, "kept": kept, "cold_users": cold}
