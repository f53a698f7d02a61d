"""The time protocols: splits that train on the past and judge on the future.

- temporal: one global cut. The interactions, in time order (ties in file order), end with the
  test period (the last `test_share` of them) and, before it, the validation period (the
  `validation_share` before that); the rest is the training period. The item vocabulary and
  the training matrix hold the training period only. A user who interacts in a period is scored
  there on those interactions (items of the vocabulary), with everything they did before the
  period's start as the history; a user with no such history is not scored (counted).
- last: leave-last-out by time. Each user's last `last_n` interactions are their test targets
  and the `last_n` before them their validation targets (users with at least 2 last_n + 1);
  the rest trains and is the history (the test history adds the validation targets).

Filters count the training period only under temporal, so that what happens later decides
nothing: min_item_users keeps items with enough training users, min_user_items keeps the
training rows of users with enough of them (a user with fewer is still scored in a later period,
on that history); under last they count each user's whole history, as the leave-one-out papers
do. Nothing of a validation or test period reaches the training matrix.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import scipy.sparse as sp

from vaecf.config.settings import spelled
from vaecf.data.sources import ITEM, TIME, USER
from vaecf.errors import DataError

PERIODS = ("train", "validation", "test")


def _csr(frame: pl.DataFrame, users: pl.Series, n_items: int) -> sp.csr_matrix:
    """`frame`'s (user, item) pairs as a CSR matrix whose row r is `users[r]` (sorted ids)."""
    rows = np.searchsorted(users.to_numpy(), frame.get_column(USER).to_numpy())
    cols = frame.get_column("iidx").to_numpy()
    m = sp.csr_matrix((np.ones(rows.size, dtype=np.float32), (rows, cols)), (len(users), n_items))
    m.sort_indices()
    return m


def periods(df: pl.DataFrame, settings) -> pl.DataFrame:
    """`df` (user_id, item_id, time in time order) with a "period" column. Under temporal the
    rows are counted as they came (a pair repeated later is dropped after, so that a repeat in
    the future moves no cut); under last they are each user's distinct items."""
    n = df.height
    if settings.protocol == "temporal":
        n_test = int(np.ceil(settings.test_share * n))
        n_val = int(np.ceil(settings.validation_share * n))
        if n - n_test - n_val < 1:
            shares = f"{spelled('validation_share')} or {spelled('test_share')}"
            raise DataError(
                f"no interactions are left to train on before the held-out periods: lower {shares}"
            )
        label = np.repeat(np.array(PERIODS), [n - n_val - n_test, n_val, n_test])
        return df.with_columns(period=pl.Series(label))
    k = settings.last_n
    back = pl.int_range(pl.len()).reverse().over(USER)  # 0 for each user's last interaction
    held = pl.len().over(USER) >= 2 * k + 1
    period = (
        pl.when(held & (back < k)).then(pl.lit("test"))
        .when(held & (back < 2 * k)).then(pl.lit("validation"))
        .otherwise(pl.lit("train"))
    )  # fmt: skip
    return df.with_columns(period=period)


def time_filtered(df: pl.DataFrame, settings) -> pl.DataFrame:
    """The filters, counted on what may decide them (see the module's doc). Under temporal the
    item filter counts the training period, and the user filter keeps a user's training rows
    only where they have enough of them (`training_rows`); under last both count each user's
    whole history."""
    if settings.protocol == "temporal":
        if settings.min_item_users > 0:
            n = pl.col(USER).filter(pl.col("period") == "train").n_unique().over(ITEM)
            df = df.filter(n.fill_null(0) >= settings.min_item_users)
        return df
    if settings.min_item_users > 0:
        df = df.filter(pl.col(USER).n_unique().over(ITEM) >= settings.min_item_users)
    if settings.min_user_items > 1:
        df = df.filter(pl.len().over(USER) >= settings.min_user_items)
    return df


def training_rows(known: pl.DataFrame, settings) -> pl.DataFrame:
    """The training matrix's rows: the training period's, of users with at least
    min_user_items of them (under last, every user left has)."""
    train = known.filter(pl.col("period") == "train")
    return train.filter(pl.len().over(USER) >= settings.min_user_items)


def split_by_time(df: pl.DataFrame, settings, counts: dict):
    """The five matrices of a time protocol from `df`'s distinct pairs in time order, each in
    its period (`periods`); the users in row order and the split sizes, the vocabulary's item
    ids; `counts` gets the periods' sizes."""
    if TIME not in df.columns:
        raise DataError(
            f"the {settings.protocol} protocol needs when each interaction happened: name the "
            f"time column with {spelled('time_col')}"
        )
    df = time_filtered(df, settings)
    train = df.filter(pl.col("period") == "train")
    if train.height == 0:
        raise DataError(
            "no interactions are left in the training period after filtering: lower "
            f"{spelled('min_user_items')}"
        )
    item_ids = train.get_column(ITEM).unique(maintain_order=True)
    items = pl.DataFrame({ITEM: item_ids, "iidx": np.arange(item_ids.len(), dtype=np.int64)})
    df = df.join(items, on=ITEM, how="left", maintain_order="left")
    counts["n_heldout_pairs_unknown_item"] = int(df.get_column("iidx").null_count())
    known = df.filter(pl.col("iidx").is_not_null())
    for p in PERIODS:
        counts[f"n_{p}_period_pairs"] = int((df.get_column("period") == p).sum())
    train_rows = training_rows(known, settings)
    train_users = train_rows.get_column(USER).unique().sort()
    mats, users = {}, [train_users]
    mats["train"] = _csr(train_rows, train_users, len(items))
    for split, before in (("validation", ("train",)), ("test", ("train", "validation"))):
        history = known.filter(pl.col("period").is_in(before))
        targets = known.filter(pl.col("period") == split)
        scored = targets.join(history.select(USER).unique(), on=USER, how="semi")
        ids = scored.get_column(USER).unique().sort()
        counts[f"n_{split}_users_without_history"] = targets.get_column(USER).n_unique() - len(ids)
        hist = history.join(scored.select(USER).unique(), on=USER, how="semi")
        mats[f"{split}_tr"] = _csr(hist, ids, len(items))
        mats[f"{split}_te"] = _csr(scored, ids, len(items))
        users.append(ids)
    wanted_test = settings.protocol == "last" or settings.test_share > 0
    if (wanted_test and mats["test_te"].shape[0] == 0) or mats["validation_te"].shape[0] == 0:
        empty = "validation" if mats["validation_te"].shape[0] == 0 else "test"
        raise DataError(
            f"no user of the {empty} period has a history before it to fold in: raise "
            f"{spelled(empty + '_share')} or lower {spelled('min_user_items')}"
        )
    order = pl.concat(users).to_numpy()
    sizes = tuple(len(u) for u in users)
    return mats, order, sizes, item_ids
