"""Preprocessing: every choice it makes (`PrepareSettings`, a registry dataset's own through
`dataset_settings`), and an interaction frame binarized, deduplicated, filtered and split by
them into the five CSR matrices (`preprocess`; the rules of the split: vaecf.data.splits),
and the names kept for the vocabulary's items (`vocab_names`). vaecf.data.prepare writes what
comes out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl
import scipy.sparse as sp

from vaecf.config.settings import setting, spelled, validate_fields
from vaecf.data import splits
from vaecf.data.sources import ITEM, NAME, RATING, TIME, USER
from vaecf.data.vocab import cut_names
from vaecf.errors import DataError

# the settings that apply to one protocol only, and their defaults under it
PROTOCOL_FIELDS = {
    "liang": {"heldout_users": 10_000},
    "thesis": {"validation_frac": 0.07, "test_frac": 0.07},
    "temporal": {"validation_share": 0.1, "test_share": 0.1},
    "last": {"last_n": 1},
}
TIME_PROTOCOLS = ("temporal", "last")  # vaecf.data.timesplit


@dataclass
class PrepareSettings:
    """Every preprocessing choice; all of it is hashed into the fingerprint.

    Settings of the other protocol stay None (the default for the chosen protocol is filled in);
    `validate` refuses one that is set, since it would do nothing.
    """

    min_rating: float | None = setting(
        None,
        "keep rows with rating >= X as positives (the paper keeps 'rating > 3.5' on MovieLens); "
        "unset: every row",
    )
    min_item_users: int = setting(0, "first drop items with fewer users")
    min_user_items: int = setting(5, "then drop users with fewer positives, as the paper does")
    protocol: Literal["liang", "thesis", "temporal", "last"] = setting(
        "liang",
        "liang: N validation + N test users (the paper); thesis: percentages of users; "
        "temporal: the last interactions in time are the test and validation periods; last: "
        "each user's last interactions are their test and validation targets",
    )
    heldout_users: int | None = setting(None, "liang: N users in validation, and N in test")
    validation_frac: float | None = setting(None, "thesis: fraction of users for validation")
    test_frac: float | None = setting(None, "thesis: fraction of users for test (0: none)")
    validation_share: float | None = setting(
        None, "temporal: share of the interactions, before the test period, for validation"
    )
    test_share: float | None = setting(None, "temporal: share of the last interactions for test")
    last_n: int | None = setting(
        None, "last: each user's last N for test, the N before for validation"
    )
    target_frac: float = setting(0.2, "fraction of each held-out user's items to predict")
    seed: int = setting(98765, "seed of the user shuffle and the fold-in split, the paper's")

    def __post_init__(self) -> None:
        for key, default in PROTOCOL_FIELDS.get(self.protocol, {}).items():
            if getattr(self, key) is None:
                setattr(self, key, default)

    def validate(self) -> None:
        validate_fields(self, DataError)  # a bad protocol is bad data settings
        for other, keys in PROTOCOL_FIELDS.items():
            if other == self.protocol:
                continue
            for key in keys:
                if getattr(self, key) is not None:
                    mine = ", ".join(spelled(k) for k in PROTOCOL_FIELDS[self.protocol])
                    raise DataError(
                        f"{spelled(key, getattr(self, key))} applies to the {other} "
                        f"protocol only, and this dataset is split with the {self.protocol} "
                        f"protocol, where it would do nothing. Drop it, use {mine} instead, or "
                        f"pass {spelled('protocol', other)}"
                    )
        if self.min_user_items < 1 or self.min_item_users < 0:
            raise DataError(
                f"{spelled('min_user_items')} must be at least 1 and {spelled('min_item_users')} "
                "at least 0"
            )
        if not 0 < self.target_frac < 1:
            raise DataError(f"the target fraction {spelled('target_frac')} must lie in (0, 1)")
        if self.protocol == "thesis":
            if not 0 < self.validation_frac < 1:
                raise DataError(
                    f"{spelled('validation_frac')} must lie strictly between 0 and 1 "
                    "(vaecf.fit's validation= takes a share or a number of users)"
                )
            if not 0 <= self.test_frac < 1:  # 0: no test users (a production fit)
                raise DataError(f"{spelled('test_frac')} must lie in [0, 1) (vaecf.fit: test=)")
        if self.protocol == "temporal":
            if not 0 < self.validation_share < 0.5:
                raise DataError(
                    f"{spelled('validation_share')} must lie strictly between 0 and 0.5"
                )
            if not 0 <= self.test_share < 0.5:  # 0: no test period (a production fit)
                raise DataError(f"{spelled('test_share')} must lie in [0, 0.5)")
        if self.protocol == "last" and self.last_n < 1:
            raise DataError(f"{spelled('last_n')} must be at least 1")


def file_protocol(heldout_users: int | None, protocol: str | None = None) -> dict:
    """How a file of one's own is split (`vaecf prepare csv`, `compare --data`): `protocol`
    where given; else the paper's N validation + N test users where `heldout_users` gives N,
    else 7% + 7% of its users (the thesis protocol, as the named small datasets are split)."""
    if protocol is not None:
        return {"protocol": protocol}
    return {"protocol": "thesis"} if heldout_users is None else {"heldout_users": heldout_users}


def dataset_settings(name: str, **overrides) -> PrepareSettings:
    """The registry's protocol for `name`, with any field overridden (None = keep the default).

    `protocol="liang"|"thesis"` switches the held-out rule; the other defaults stay. Overriding a
    setting that the resulting protocol does not use (e.g. heldout_users under "thesis") raises a
    DataError that says which settings apply.
    """
    from vaecf.data.datasets import get

    spec = get(name)
    fields = {**spec.defaults}
    given = {}
    for key, value in overrides.items():
        if key not in PrepareSettings.__dataclass_fields__:
            raise DataError(f"unknown preprocessing setting {key!r}")
        if value is not None:
            given[key] = value
    fields.update(given)
    protocol = fields.get("protocol", "liang")
    for other, keys in PROTOCOL_FIELDS.items():
        if other == protocol:
            continue
        for key in keys:
            if key in given:
                mine = ", ".join(spelled(k) for k in PROTOCOL_FIELDS.get(protocol, {}))
                how = "its default" if "protocol" not in given else spelled("protocol")
                raise DataError(
                    f"{spelled(key)} applies to the {other} protocol only, but {name} is split "
                    f"with the {protocol} protocol ({how}), where it would do nothing. Use "
                    f"{mine} instead, or pass {spelled('protocol', other)} "
                    f"{spelled(key, given[key])}"
                )
            fields.pop(key, None)  # a registry default of the protocol not chosen
    settings = PrepareSettings(**fields)
    settings.validate()
    return settings


def _csr(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    m = sp.csr_matrix((np.ones(rows.size, dtype=np.float32), (rows, cols)), shape=shape)
    m.sort_indices()
    return m


def _heldout(df: pl.DataFrame, lo: int, hi: int, n_items: int, settings: PrepareSettings):
    """Fold-in and target CSR for users with lo <= uidx < hi (rows restricted to known items)."""
    part = df.filter((pl.col("uidx") >= lo) & (pl.col("uidx") < hi) & pl.col("iidx").is_not_null())
    # the paper's groupby('userId') visits users in sorted raw-id order, rows in file order
    part = part.sort([USER, "row"])
    sizes = part.group_by(USER, maintain_order=True).len().get_column("len").to_numpy()
    mask = splits.fold_in_mask(sizes, settings.seed, settings.target_frac, min_items=5)
    rows = part.get_column("uidx").to_numpy() - lo
    cols = part.get_column("iidx").to_numpy()
    shape = (hi - lo, n_items)
    return _csr(rows[~mask], cols[~mask], shape), _csr(rows[mask], cols[mask], shape)


def first_pairs(df: pl.DataFrame) -> pl.DataFrame:
    """The rows whose (user, item) pair did not occur before (file order kept).

    Same result as `unique(keep="first", maintain_order=True)`; for integer ids it works on one
    int64 key per row (a linear pass when the file is sorted, as MovieLens' is, else a stable
    argsort), several times faster and leaner than hashing pairs.
    """
    n = df.height
    u, i = df.get_column(USER), df.get_column(ITEM)
    if n and u.dtype.is_integer() and i.dtype.is_integer():
        umin, umax, imin, imax = int(u.min()), int(u.max()), int(i.min()), int(i.max())
        span = imax - imin + 1
        if (umax - umin + 1) * span < 2**62:
            key = (u.to_numpy().astype(np.int64) - umin) * span
            key += i.to_numpy().astype(np.int64) - imin
            keep = np.empty(n, dtype=bool)
            keep[0] = True
            if bool(np.all(key[1:] >= key[:-1])):  # sorted: duplicates are neighbours
                np.not_equal(key[1:], key[:-1], out=keep[1:])
            else:
                order = np.argsort(key, kind="stable")  # equal keys keep their file order
                key = key[order]
                first = keep.copy()
                np.not_equal(key[1:], key[:-1], out=first[1:])
                keep[:] = False
                keep[order[first]] = True
            del key
            return df if keep.all() else df.filter(pl.Series(keep))
    return df.filter(pl.struct(USER, ITEM).is_first_distinct())


@dataclass
class Preprocessed:
    """An interaction frame, filtered and split: the five matrices by split name, the counts for
    the manifest, the raw user ids in row order (training, then validation, then test users;
    `sizes`: how many of each) and the raw item ids in column order."""

    mats: dict[str, sp.csr_matrix]
    counts: dict[str, int]
    users: np.ndarray
    sizes: tuple[int, int, int]
    item_ids: pl.Series


def preprocess(df: pl.DataFrame, settings: PrepareSettings) -> Preprocessed:
    """Binarize, filter and split `df` (columns user_id, item_id[, rating]) by `settings`."""
    counts: dict[str, int] = {"n_rows": df.height}
    if settings.protocol in TIME_PROTOCOLS:
        return _preprocess_by_time(df, settings, counts)
    df = _filtered(df, settings, counts)
    users = df.get_column(USER).unique().sort().to_numpy()
    if settings.protocol == "liang":
        n_tr, n_val, n_te = splits.heldout_counts_liang(users.size, settings.heldout_users)
    else:
        n_tr, n_val, n_te = splits.heldout_counts_percent(
            users.size, settings.validation_frac, settings.test_frac
        )
    order = splits.shuffle_users(users, settings.seed)
    user_frame = pl.DataFrame({USER: order, "uidx": np.arange(order.size, dtype=np.int64)})

    df = df.with_row_index("row").join(user_frame, on=USER, how="inner").sort("row")
    train = df.filter(pl.col("uidx") < n_tr)
    item_ids = train.get_column(ITEM).unique(maintain_order=True)
    n_items = item_ids.len()
    item_frame = pl.DataFrame({ITEM: item_ids, "iidx": np.arange(n_items, dtype=np.int64)})
    df = df.join(item_frame, on=ITEM, how="left").sort("row")

    train = df.filter(pl.col("uidx") < n_tr)
    mats = {
        "train": _csr(
            train.get_column("uidx").to_numpy(),
            train.get_column("iidx").to_numpy(),
            (n_tr, n_items),
        )
    }
    mats["validation_tr"], mats["validation_te"] = _heldout(
        df, n_tr, n_tr + n_val, n_items, settings
    )
    mats["test_tr"], mats["test_te"] = _heldout(
        df, n_tr + n_val, n_tr + n_val + n_te, n_items, settings
    )
    counts.update(
        n_users=int(users.size),
        n_items=int(n_items),
        n_train_users=n_tr,
        n_validation_users=n_val,
        n_test_users=n_te,
        n_heldout_pairs_unknown_item=int(df.get_column("iidx").null_count()),
        **{f"nnz_{k}": int(m.nnz) for k, m in mats.items()},
    )
    return Preprocessed(mats, counts, order, (n_tr, n_val, n_te), item_ids)


def _preprocess_by_time(df: pl.DataFrame, settings: PrepareSettings, counts: dict):
    """A time protocol's split (vaecf.data.timesplit) of `df`'s positives in time order (ties
    in file order), each pair at its first time."""
    from vaecf.data.timesplit import periods, split_by_time

    if TIME not in df.columns:
        raise DataError(
            f"the {settings.protocol} protocol needs when each interaction happened: name the "
            f"time column with {spelled('time_col')}"
        )
    df = _rated(df.sort(TIME, maintain_order=True), settings, counts).select(USER, ITEM, TIME)
    if settings.protocol == "temporal":  # the cut is placed among the rows as they came: a
        df = first_pairs(periods(df, settings))  # repeat later on drops out, moving nothing
    else:  # each user's last distinct items
        df = periods(first_pairs(df), settings)
    counts["n_unique_pairs"] = df.height
    mats, order, sizes, item_ids = split_by_time(df, settings, counts)
    counts.update(
        n_users=df.get_column(USER).n_unique(),
        n_items=item_ids.len(),
        n_train_users=sizes[0],
        n_validation_users=sizes[1],
        n_test_users=sizes[2],
        **{f"nnz_{k}": int(m.nnz) for k, m in mats.items()},
    )
    counts["n_filtered_pairs"] = sum(int(m.nnz) for k, m in mats.items() if k != "test_tr")
    return Preprocessed(mats, counts, order, sizes, item_ids)


def _rated(df: pl.DataFrame, settings, counts: dict) -> pl.DataFrame:
    """`df`'s rows rated at least min_rating (all of them without it)."""
    if settings.min_rating is not None:
        if RATING not in df.columns:
            raise DataError(
                f"{spelled('min_rating')} needs a rating column: {spelled('rating_col')}"
            )
        df = df.filter(pl.col(RATING) >= settings.min_rating)
    counts["n_positive_rows"] = df.height
    return df


def _filtered(df: pl.DataFrame, settings: PrepareSettings, counts: dict) -> pl.DataFrame:
    """`df`'s distinct (user, item) pairs rated at least min_rating, of items with enough users
    and users with enough items; `counts` gets the rows left after each step."""
    df = first_pairs(_rated(df, settings, counts).select(USER, ITEM))
    counts["n_unique_pairs"] = df.height
    if settings.min_item_users > 0:
        df = df.filter(pl.len().over(ITEM) >= settings.min_item_users)
    if settings.min_user_items > 1:
        df = df.filter(pl.len().over(USER) >= settings.min_user_items)
    counts["n_filtered_pairs"] = df.height
    if df.height == 0:
        raise DataError(
            f"no interactions remain after filtering: lower {spelled('min_rating')} or "
            f"{spelled('min_user_items')}"
        )
    return df


def vocab_names(names: pl.DataFrame, item_ids: pl.Series, what: str) -> tuple[pl.DataFrame, int]:
    """(item_id, name) of the vocabulary's items that `names` names: ids cast to the vocabulary's
    type, blank names dropped, the first name of an id kept, in vocabulary order, names longer
    than vocab.MAX_NAME_CHARS cut to that length; and how many were cut."""
    ids = names.get_column(ITEM)
    if item_ids.dtype.is_integer():
        ids = ids.cast(pl.String).str.strip_chars().cast(pl.Int64, strict=False)
    else:
        ids = ids.cast(pl.String).str.strip_chars()
    name = names.get_column(NAME).cast(pl.String).str.strip_chars()
    df = pl.DataFrame({ITEM: ids, NAME: name}).filter(
        pl.col(ITEM).is_not_null() & pl.col(NAME).is_not_null() & (pl.col(NAME) != "")
    )
    df = df.unique(subset=ITEM, keep="first", maintain_order=True)
    vocab = pl.DataFrame({ITEM: item_ids.cast(df.schema[ITEM])}).with_row_index("pos")
    out = vocab.join(df, on=ITEM, how="inner").sort("pos")
    if out.height == 0 and names.height > 0:
        raise DataError(
            f"none of the {names.height} ids in {what} is an item of the dataset; check that its "
            "id column (--name-id-col) holds the same ids as the interactions' --item-col"
        )
    cut, n_cut = cut_names(out.get_column(NAME))
    return out.select(pl.col(ITEM).cast(item_ids.dtype)).with_columns(cut), n_cut
