"""The users cut into chunks: every user in exactly one chunk, in order, each chunk's rows
counted right and within chunk_rows (but for one user alone), for integer ids at any range
(counted by value range) and for text ids (counted user by user)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from vaecf.score import plan_chunks


def _check(df: pl.DataFrame, chunk_rows: int, exact_users: bool = True) -> list:
    chunks, n_users = plan_chunks(df.lazy(), "u", chunk_rows)
    counts = df.group_by("u").agg(pl.len().alias("n")).sort("u")
    users, lens = counts.get_column("u").to_list(), counts.get_column("n").to_list()
    at = 0
    for lo, hi, rows in chunks:  # consecutive runs of the sorted users
        assert users[at] == lo
        end = users.index(hi) + 1
        assert rows == sum(lens[at:end])
        assert rows <= chunk_rows or end - at == 1  # over it: one user alone
        at = end
    assert at == len(users)
    if exact_users:
        assert n_users == len(users)
    return chunks


@pytest.mark.parametrize("seed", range(4))
def test_integer_ids_at_any_range(seed):
    rng = np.random.default_rng(seed)
    scale = [10, 10**6, 2**40, 2**62][seed]
    ids = rng.integers(-scale, scale, 3000)
    users = np.repeat(ids, rng.integers(1, 30, ids.size))
    df = pl.DataFrame({"u": rng.permutation(users), "i": np.arange(users.size)})
    _check(df, 2000)


def test_a_heavy_user_and_extreme_ids():
    users = [-(2**63), 0, 5, 5, 2**63 - 1] + [7] * 500
    df = pl.DataFrame({"u": pl.Series(users, dtype=pl.Int64), "i": range(len(users))})
    chunks = _check(df, 100)
    assert (7, 7, 500) in chunks


def test_text_ids_user_by_user():
    rng = np.random.default_rng(0)
    users = [f"user-{u}" for u in rng.integers(0, 2000, 20_000)]
    df = pl.DataFrame({"u": users, "i": range(len(users))})
    chunks = _check(df, 1500)
    assert all(rows <= 1500 for _, _, rows in chunks)


def test_no_rows():
    assert plan_chunks(pl.LazyFrame({"u": [], "i": []}, schema={"u": pl.Int64, "i": pl.Int64}),
                       "u", 10) == ([], 0)  # fmt: skip
