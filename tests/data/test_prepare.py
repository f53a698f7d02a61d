"""prepare: vaecf's output against an independent pandas re-implementation of the paper's code.

The reference below follows the preprocessing notebook of Liang et al. (WWW'18, "Variational
Autoencoders for Collaborative Filtering", ML-20M notebook) line for line, with the global
`np.random.seed` calls of the original, so every split must match vaecf's exactly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest

import vaecf.data.prepare as prep
from vaecf.data import splits
from vaecf.data.prepare import (
    SPLIT_FILES,
    PreparedDataset,
    PrepareSettings,
    fingerprint,
    prepare_csv,
    prepare_frame,
)
from vaecf.errors import DataError

HALF_STARS = np.arange(1, 11) / 2.0  # 0.5, 1.0, ..., 5.0
THRESHOLD = 3.5  # the paper keeps rating > 3.5, i.e. >= 4 on this scale; we use >= 3.5
RATING_BANDS = np.array([THRESHOLD, 4.5])  # every min_rating the equivalence tests use


# --------------------------------------------------------------------------------------------
# Synthetic raw ratings file
# --------------------------------------------------------------------------------------------


def _scrambled_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """n distinct positive ints in random order with 1..5 digits (numeric != lexicographic)."""
    out: list[int] = []
    seen: set[int] = set()
    while len(out) < n:
        v = int(np.exp(rng.uniform(0.0, np.log(100_000))))
        if v not in seen:
            seen.add(v)
            out.append(v)
    return np.array(out, dtype=np.int64)


def make_ratings(
    seed: int = 0, n_users: int = 260, n_items: int = 150, string_ids: bool = False
) -> pd.DataFrame:
    """MovieLens-like rows (userId, movieId, rating, timestamp) in a scrambled file order.

    Half-star ratings, heavy-tailed activity (many users end under 5 positives), Zipf item
    popularity, 20 rare items seen once (so held-out users have items unknown to training), and
    ~30 duplicated (user, item) rows placed after their original. A duplicate's rating lies on
    the same side of every RATING_BANDS threshold as its original, so "filter, then drop
    duplicates" (vaecf) and "drop duplicates, then filter" (the reference) must agree.
    """
    rng = np.random.default_rng(seed)
    uids = _scrambled_ids(rng, n_users)
    iids = _scrambled_ids(rng, n_items + 20)
    core, rare = iids[:n_items], iids[n_items:]
    pop = (np.arange(n_items) + 1.0) ** -0.9
    pop /= pop.sum()
    us, its, rs = [], [], []
    for u in uids:
        k = int(np.clip(rng.lognormal(np.log(20), 0.8), 1, n_items // 2))
        us.append(np.full(k, u))
        its.append(rng.choice(core, size=k, replace=False, p=pop))
        rs.append(rng.choice(HALF_STARS, size=k))
    us.append(rng.choice(uids, size=rare.size))
    its.append(rare)
    rs.append(np.full(rare.size, 5.0))
    u, i, r = np.concatenate(us), np.concatenate(its), np.concatenate(rs)
    perm = rng.permutation(u.size)
    u, i, r = u[perm], i[perm], r[perm]
    key = np.arange(u.size, dtype=np.float64)
    # duplicates: a copy of row p, placed somewhere after p
    dup = rng.choice(u.size - 1, size=30, replace=False)
    band = np.searchsorted(RATING_BANDS, HALF_STARS, side="right")
    dup_r = np.array([rng.choice(HALF_STARS[band == band[int(r[p] * 2) - 1]]) for p in dup])
    u, i, r = np.r_[u, u[dup]], np.r_[i, i[dup]], np.r_[r, dup_r]
    key = np.r_[key, rng.uniform(dup + 0.5, key.size)]
    order = np.argsort(key, kind="stable")
    df = pd.DataFrame(
        {
            "userId": u[order],
            "movieId": i[order],
            "rating": r[order],
            "timestamp": rng.integers(800_000_000, 1_500_000_000, u.size),
        }
    )
    if string_ids:
        df["userId"] = "u" + df["userId"].astype(str)
        df["movieId"] = "i" + df["movieId"].astype(str)
    return df


# --------------------------------------------------------------------------------------------
# Reference: the paper's notebook in plain pandas/numpy
# --------------------------------------------------------------------------------------------


def get_count(tp: pd.DataFrame, col: str) -> pd.Series:
    return tp[[col]].groupby(col).size()


def filter_triplets(tp: pd.DataFrame, min_uc: int = 5, min_sc: int = 0):
    if min_sc > 0:
        itemcount = get_count(tp, "movieId")
        tp = tp[tp["movieId"].isin(itemcount.index[itemcount >= min_sc])]
    if min_uc > 0:
        usercount = get_count(tp, "userId")
        tp = tp[tp["userId"].isin(usercount.index[usercount >= min_uc])]
    return tp, get_count(tp, "userId"), get_count(tp, "movieId")


def split_train_test_proportion(data: pd.DataFrame, seed: int, test_prop: float = 0.2):
    data_grouped_by_user = data.groupby("userId")
    tr_list, te_list = [], []
    np.random.seed(seed)
    for _, group in data_grouped_by_user:
        n_items_u = len(group)
        if n_items_u >= 5:
            idx = np.zeros(n_items_u, dtype="bool")
            pick = np.random.choice(n_items_u, size=int(test_prop * n_items_u), replace=False)
            idx[pick.astype("int64")] = True
            tr_list.append(group[np.logical_not(idx)])
            te_list.append(group[idx])
        else:
            tr_list.append(group)
    empty = data.iloc[:0]
    return pd.concat(tr_list or [empty]), pd.concat(te_list or [empty])


def paper_reference(
    raw: pd.DataFrame,
    *,
    min_rating: float | None = THRESHOLD,
    min_uc: int = 5,
    min_sc: int = 0,
    n_heldout: int = 30,
    seed: int = 98765,
    test_prop: float = 0.2,
    cut: tuple[int, int, int] | None = None,
) -> dict:
    """Splits as {name: set of (row, col)}, users and items in index order, and counts.

    `cut` = (train, validation, test) user counts overrides the N + N held-out rule (thesis).
    """
    counts = {"n_rows": len(raw)}
    if min_rating is not None:
        counts["n_positive_rows"] = int((raw["rating"] >= min_rating).sum())
    else:
        counts["n_positive_rows"] = len(raw)
    raw = raw.drop_duplicates(subset=["userId", "movieId"], keep="first")  # not in the paper
    if min_rating is not None:
        raw = raw[raw["rating"] >= min_rating]
    counts["n_unique_pairs"] = len(raw)
    raw_data, user_activity, _ = filter_triplets(raw, min_uc=min_uc, min_sc=min_sc)
    counts["n_filtered_pairs"] = len(raw_data)

    state = np.random.get_state()
    try:
        unique_uid = user_activity.index
        np.random.seed(seed)
        idx_perm = np.random.permutation(unique_uid.size)
        unique_uid = unique_uid[idx_perm]
        n_users = unique_uid.size
        if cut is None:
            n_tr, n_val, n_te = n_users - 2 * n_heldout, n_heldout, n_heldout
        else:
            n_tr, n_val, n_te = cut
        assert n_tr + n_val + n_te == n_users
        tr_users = unique_uid[:n_tr]
        vd_users = unique_uid[n_tr : n_tr + n_val]
        te_users = unique_uid[n_tr + n_val :]

        train_plays = raw_data.loc[raw_data["userId"].isin(tr_users)]
        unique_sid = pd.unique(train_plays["movieId"])
        show2id = {sid: i for (i, sid) in enumerate(unique_sid)}
        profile2id = {pid: i for (i, pid) in enumerate(unique_uid)}

        vad_all = raw_data.loc[raw_data["userId"].isin(vd_users)]
        vad_plays = vad_all.loc[vad_all["movieId"].isin(unique_sid)]
        vad_plays_tr, vad_plays_te = split_train_test_proportion(vad_plays, seed, test_prop)
        test_all = raw_data.loc[raw_data["userId"].isin(te_users)]
        test_plays = test_all.loc[test_all["movieId"].isin(unique_sid)]
        test_plays_tr, test_plays_te = split_train_test_proportion(test_plays, seed, test_prop)
    finally:
        np.random.set_state(state)

    def numerize(tp: pd.DataFrame, start: int) -> set[tuple[int, int]]:
        rows = [profile2id[x] - start for x in tp["userId"].tolist()]
        cols = [show2id[x] for x in tp["movieId"].tolist()]
        return set(zip(rows, cols, strict=True))

    heldout_sizes = [*vad_plays.groupby("userId").size(), *test_plays.groupby("userId").size()]
    counts.update(
        n_users=int(n_users),
        n_items=len(unique_sid),
        n_train_users=n_tr,
        n_validation_users=n_val,
        n_test_users=n_te,
        n_heldout_pairs_unknown_item=(len(vad_all) - len(vad_plays))
        + (len(test_all) - len(test_plays)),
    )
    out = {
        "splits": {
            "train": numerize(train_plays, 0),
            "validation_tr": numerize(vad_plays_tr, n_tr),
            "validation_te": numerize(vad_plays_te, n_tr),
            "test_tr": numerize(test_plays_tr, n_tr + n_val),
            "test_te": numerize(test_plays_te, n_tr + n_val),
        },
        "users": list(unique_uid),
        "items": list(unique_sid),
        "cut": (n_tr, n_val, n_te),
        "counts": counts,
        "heldout_sizes": heldout_sizes,
    }
    for name, pairs in out["splits"].items():
        out["counts"][f"nnz_{name}"] = len(pairs)
    return out


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def csr_pairs(m) -> set[tuple[int, int]]:
    coo = m.tocoo()
    assert np.all(coo.data == 1.0), "a prepared matrix holds something other than ones"
    pairs = set(zip(coo.row.tolist(), coo.col.tolist(), strict=True))
    assert len(pairs) == coo.nnz, "duplicate entries in a prepared matrix"
    return pairs


def _py(values) -> list:
    return [v.item() if isinstance(v, np.generic) else v for v in values]


def assert_matches_reference(ds: PreparedDataset, ref: dict) -> None:
    n_tr, n_val, n_te = ref["cut"]
    n_items = len(ref["items"])
    shapes = {
        "train": (n_tr, n_items),
        "validation_tr": (n_val, n_items),
        "validation_te": (n_val, n_items),
        "test_tr": (n_te, n_items),
        "test_te": (n_te, n_items),
    }
    for name in SPLIT_FILES:
        m = ds.split(name)
        assert m.shape == shapes[name], name
        got = csr_pairs(m)
        want = ref["splits"][name]
        assert got == want, (
            f"{name}: {len(got - want)} pairs only in vaecf, {len(want - got)} only in reference"
        )
    items = pl.read_parquet(ds.path / "items.parquet").get_column("item_id").to_list()
    assert items == _py(ref["items"])
    assert ds.items.ids.to_list() == _py(ref["items"])
    users = pl.read_parquet(ds.path / "users.parquet")
    assert users.get_column("user_id").to_list() == _py(ref["users"])
    assert users.get_column("split").to_list() == (
        ["train"] * n_tr + ["validation"] * n_val + ["test"] * n_te
    )


def write_csv(df: pd.DataFrame, path: Path, sep: str = ",") -> Path:
    df.to_csv(path, index=False, sep=sep)
    return path


@pytest.fixture(scope="module")
def ratings() -> pd.DataFrame:
    return make_ratings(seed=0)


@pytest.fixture(scope="module")
def csv_file(ratings, tmp_path_factory) -> Path:
    return write_csv(ratings, tmp_path_factory.mktemp("raw") / "ratings.csv")


def settings(**kw) -> PrepareSettings:
    base = dict(min_rating=THRESHOLD, min_user_items=5)
    if kw.get("protocol", "liang") == "liang":  # heldout_users applies to liang only
        base["heldout_users"] = 30
    base.update(kw)
    return PrepareSettings(**base)


def prepare(path: Path, out: Path, rating_col: str | None = "rating", **kw) -> PreparedDataset:
    return prepare_csv(path, out, "userId", "movieId", rating_col, settings=settings(**kw))


# --------------------------------------------------------------------------------------------
# 1. Equivalence with the paper's preprocessing
# --------------------------------------------------------------------------------------------


def test_fixture_exercises_the_edge_cases(ratings):
    """The synthetic file really has what the equivalence tests rely on."""
    assert 5_000 <= len(ratings) <= 12_000
    assert ratings.duplicated(["userId", "movieId"]).sum() >= 20
    assert set(ratings["rating"]) <= set(HALF_STARS)
    file_users = pd.unique(ratings["userId"])
    assert list(file_users) != sorted(file_users)
    assert sorted(file_users) != sorted(file_users, key=str)  # numeric != lexicographic order
    pos = ratings[ratings["rating"] >= THRESHOLD].drop_duplicates(["userId", "movieId"])
    per_user = pos.groupby("userId").size()
    assert (per_user < 5).sum() >= 20  # users dropped by min_uc
    ref = paper_reference(ratings, min_uc=3, min_sc=2, n_heldout=30)
    assert ref["counts"]["n_heldout_pairs_unknown_item"] > 0
    assert min(ref["heldout_sizes"]) < 5 <= max(ref["heldout_sizes"])  # both fold-in branches
    ref = paper_reference(ratings)
    assert ref["counts"]["n_heldout_pairs_unknown_item"] > 0
    assert all(len(ref["splits"][s]) > 0 for s in SPLIT_FILES)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # the paper's settings: min_uc=5, no item filter, seed 98765
        dict(min_user_items=3, min_item_users=2, heldout_users=25),
        dict(min_user_items=5, min_item_users=4, heldout_users=40, seed=7),
        dict(min_rating=4.5, min_user_items=2, heldout_users=20, seed=1),
        dict(min_rating=None, min_user_items=10, heldout_users=30, seed=3),
        dict(target_frac=0.35, heldout_users=35),
    ],
    ids=["paper", "min_sc2_min_uc3", "min_sc4_seed7", "min_rating4.5", "no_rating", "frac0.35"],
)
def test_matches_paper_reference_integer_ids(ratings, csv_file, tmp_path, kw):
    s = settings(**kw)
    ref = paper_reference(
        ratings,
        min_rating=s.min_rating,
        min_uc=s.min_user_items,
        min_sc=s.min_item_users,
        n_heldout=s.heldout_users,
        seed=s.seed,
        test_prop=s.target_frac,
    )
    rating_col = None if s.min_rating is None else "rating"
    if s.min_rating is None:
        ref_no_rating = paper_reference(
            ratings.drop(columns="rating").assign(rating=5.0),
            min_rating=None,
            min_uc=s.min_user_items,
            n_heldout=s.heldout_users,
            seed=s.seed,
        )
        assert ref_no_rating["splits"] == ref["splits"]
    ds = prepare_csv(csv_file, tmp_path / "out", "userId", "movieId", rating_col, settings=s)
    assert_matches_reference(ds, ref)
    for key, value in ref["counts"].items():
        assert ds.manifest["counts"][key] == value, key


@pytest.mark.parametrize("seed", [0, 5])
def test_matches_paper_reference_string_ids(tmp_path, seed):
    raw = make_ratings(seed=seed, string_ids=True)
    users = list(pd.unique(raw["userId"]))
    assert sorted(users) != sorted(users, key=lambda x: int(x[1:]))  # 'u17' < 'u3'
    path = write_csv(raw, tmp_path / "ratings.csv")
    ds = prepare(path, tmp_path / "out", seed=seed + 11)
    ref = paper_reference(raw, seed=seed + 11)
    assert_matches_reference(ds, ref)
    assert pl.read_parquet(ds.path / "users.parquet").schema["user_id"] == pl.String
    assert ds.items.ids.dtype == pl.String
    for key, value in ref["counts"].items():
        assert ds.manifest["counts"][key] == value, key


def test_thesis_protocol_cuts_the_same_shuffle_at_percentages(ratings, csv_file, tmp_path):
    s = settings(protocol="thesis", validation_frac=0.1, test_frac=0.15, seed=42)
    ds = prepare_csv(csv_file, tmp_path / "out", "userId", "movieId", "rating", settings=s)
    n_users = paper_reference(ratings, seed=42)["counts"]["n_users"]
    n_val, n_te = round(n_users * 0.1), round(n_users * 0.15)
    ref = paper_reference(ratings, seed=42, cut=(n_users - n_val - n_te, n_val, n_te))
    assert_matches_reference(ds, ref)


def test_integer_user_ids_sort_numerically_not_as_text(tmp_path):
    # users 9, 10, 100 -> sorted [9, 10, 100]; as text it would be ['10', '100', '9']
    rows = [(u, i, 5.0) for u in (100, 9, 10, 2000, 31) for i in range(1, 7)]
    raw = pd.DataFrame(rows, columns=["userId", "movieId", "rating"])
    path = write_csv(raw, tmp_path / "r.csv")
    ds = prepare(path, tmp_path / "out", heldout_users=1, seed=3)
    users = pl.read_parquet(ds.path / "users.parquet").get_column("user_id").to_list()
    expected = np.array([9, 10, 31, 100, 2000])[np.random.RandomState(3).permutation(5)]
    assert users == expected.tolist()


def test_duplicate_rows_keep_first_and_count_once(tmp_path):
    # user 1 rates item 10 twice; it must count as one item, so user 1 (4 distinct) is dropped
    rows = [(1, 10, 5.0), (1, 11, 5.0), (1, 10, 4.0), (1, 12, 5.0), (1, 13, 5.0), (1, 10, 5.0)]
    rows += [(u, i, 5.0) for u in (2, 3, 4, 5) for i in range(10, 16)]
    raw = pd.DataFrame(rows, columns=["userId", "movieId", "rating"])
    path = write_csv(raw, tmp_path / "r.csv")
    ds = prepare(path, tmp_path / "out", heldout_users=1)
    c = ds.manifest["counts"]
    assert c["n_rows"] == len(rows)
    assert c["n_unique_pairs"] == len(rows) - 2
    assert c["n_users"] == 4
    assert 1 not in pl.read_parquet(ds.path / "users.parquet").get_column("user_id").to_list()
    assert_matches_reference(ds, paper_reference(raw, n_heldout=1))


def test_duplicate_pair_is_positive_if_any_of_its_rows_is(tmp_path):
    """vaecf filters by rating first, then drops duplicates: a low first rating of a pair does
    not hide a later high one (a dedupe-first pipeline would drop the pair). Pinned here so that
    a change of this rule is a conscious one."""
    rows = [(u, i, 5.0) for u in (2, 3, 4, 5) for i in range(10, 16)]
    rows += [(1, 10, 1.0), (1, 11, 5.0), (1, 12, 5.0), (1, 13, 5.0), (1, 14, 5.0), (1, 10, 4.5)]
    raw = pd.DataFrame(rows, columns=["userId", "movieId", "rating"])
    path = write_csv(raw, tmp_path / "r.csv")
    ds = prepare(path, tmp_path / "out", heldout_users=1, min_rating=4.0)
    users = pl.read_parquet(ds.path / "users.parquet").get_column("user_id").to_list()
    assert 1 in users  # 5 distinct positives: 11, 12, 13, 14 and the re-rated 10
    assert ds.manifest["counts"]["n_unique_pairs"] == 4 * 6 + 5
    # equivalent reference: filter by rating, then drop duplicates
    pos = raw[raw["rating"] >= 4.0].drop_duplicates(["userId", "movieId"], keep="first")
    assert_matches_reference(ds, paper_reference(pos, min_rating=None, n_heldout=1))


def test_tsv_and_parquet_give_the_same_dataset_as_csv(ratings, csv_file, tmp_path):
    base = prepare(csv_file, tmp_path / "csv")
    tsv = write_csv(ratings, tmp_path / "ratings.tsv", sep="\t")
    pq = tmp_path / "ratings.parquet"
    pl.read_csv(csv_file).write_parquet(pq)
    pq_str = tmp_path / "ratings_str.parquet"  # every column as text: ids typed by vaecf
    pl.read_csv(csv_file, infer_schema=False).write_parquet(pq_str)
    for path in (tsv, pq, pq_str):
        ds = prepare(path, tmp_path / path.name.replace(".", "_"))
        for name in SPLIT_FILES:
            a, b = base.split(name), ds.split(name)
            assert a.shape == b.shape and (a != b).nnz == 0, (path.name, name)
        assert ds.items.ids.to_list() == base.items.ids.to_list()
        u1 = pl.read_parquet(ds.path / "users.parquet")
        assert u1.equals(pl.read_parquet(base.path / "users.parquet"))
        assert ds.manifest["counts"] == base.manifest["counts"]
        assert ds.fingerprint != base.fingerprint  # different bytes, different fingerprint


def test_prepare_frame_takes_a_polars_frame(ratings, tmp_path):
    frame = pl.from_pandas(ratings).select(
        pl.col("userId").alias("user_id"),
        pl.col("movieId").alias("item_id"),
        pl.col("rating"),
    )
    ds = prepare_frame(frame, tmp_path / "out", settings())
    assert_matches_reference(ds, paper_reference(ratings))


# --------------------------------------------------------------------------------------------
# 2. Manifest, fingerprint and reuse
# --------------------------------------------------------------------------------------------


def test_manifest_counts_and_metadata(ratings, csv_file, tmp_path):
    ds = prepare(csv_file, tmp_path / "out")
    ref = paper_reference(ratings)
    m = json.loads((ds.path / "manifest.json").read_text())
    assert m == ds.manifest
    c = m["counts"]
    n_tr, n_val, n_te = ref["cut"]
    assert (c["n_train_users"], c["n_validation_users"], c["n_test_users"]) == (n_tr, n_val, n_te)
    assert c["n_items"] == len(ref["items"]) == ds.n_items
    for name in SPLIT_FILES:
        assert c[f"nnz_{name}"] == len(ref["splits"][name]) == ds.split(name).nnz
    assert c["n_rows"] == len(ratings)
    assert m["settings"] == {**vars(settings())}
    assert m["source"]["sha256"] == prep.sha256_file(csv_file)
    assert m["source"]["columns"] == {"user": "userId", "item": "movieId", "rating": "rating"}
    assert m["format_version"] == prep.FORMAT_VERSION
    assert len(m["fingerprint"]) == 16
    assert sorted(p.name for p in ds.path.iterdir()) == sorted(
        [f"{s}.npz" for s in SPLIT_FILES] + ["items.parquet", "users.parquet", "manifest.json"]
    )
    assert f"train_users={n_tr}" in repr(ds)


def test_fingerprint_changes_with_settings_and_content(ratings, csv_file, tmp_path):
    base = prepare(csv_file, tmp_path / "a")
    assert prepare(csv_file, tmp_path / "b").fingerprint == base.fingerprint  # deterministic
    other_seed = prepare(csv_file, tmp_path / "c", seed=1)
    assert other_seed.fingerprint != base.fingerprint
    other_min = prepare(csv_file, tmp_path / "d", min_user_items=6)
    assert other_min.fingerprint != base.fingerprint
    changed = write_csv(ratings.iloc[:-1], tmp_path / "changed.csv")
    assert prepare(changed, tmp_path / "e").fingerprint != base.fingerprint
    # the function itself: every settings field and the columns count
    src = {"sha256": "x", "columns": {"user": "u"}, "sep": None}
    fp = fingerprint(PrepareSettings(), src)
    assert fingerprint(PrepareSettings(), dict(src)) == fp
    assert fingerprint(PrepareSettings(), {**src, "path": "/elsewhere"}) == fp
    assert fingerprint(PrepareSettings(), {**src, "sha256": "y"}) != fp
    assert fingerprint(PrepareSettings(), {**src, "columns": {"user": "v"}}) != fp
    for field, value in [
        ("min_rating", 4.0),
        ("min_item_users", 1),
        ("min_user_items", 4),
        ("protocol", "thesis"),
        ("heldout_users", 9),
        ("validation_frac", 0.1),
        ("test_frac", 0.1),
        ("target_frac", 0.3),
        ("seed", 1),
    ]:
        assert fingerprint(PrepareSettings(**{field: value}), src) != fp, field


def test_same_inputs_reuse_the_directory(csv_file, tmp_path, monkeypatch):
    out = tmp_path / "out"
    first = prepare(csv_file, out)
    mpath = out / "manifest.json"
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    def boom(*a, **k):
        raise AssertionError("prepare_frame must not run for a cached dataset")

    monkeypatch.setattr(prep, "prepare_frame", boom)
    again = prepare(csv_file, out)
    assert again.fingerprint == first.fingerprint
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp
    assert mpath.stat().st_mtime_ns == stamp["manifest.json"]


def test_other_settings_into_same_out_need_overwrite(csv_file, tmp_path):
    out = tmp_path / "out"
    first = prepare(csv_file, out)
    with pytest.raises(DataError, match="overwrite"):
        prepare(csv_file, out, seed=1)
    assert PreparedDataset(out).fingerprint == first.fingerprint  # untouched
    replaced = prepare_csv(
        csv_file, out, "userId", "movieId", "rating", settings=settings(seed=1), overwrite=True
    )
    assert replaced.fingerprint != first.fingerprint
    assert PreparedDataset(out).manifest["settings"]["seed"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_out_that_is_not_a_dataset_is_refused(csv_file, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a prepared dataset"):
        prepare(csv_file, out)
    assert (out / "precious.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare(csv_file, empty).split("train").nnz > 0  # an empty directory is fine


def test_prepared_dataset_errors(tmp_path, csv_file):
    with pytest.raises(DataError, match="no manifest.json"):
        PreparedDataset(tmp_path)
    with pytest.raises(DataError, match=r"it is a file: prepare it first, `vaecf prepare csv"):
        PreparedDataset(csv_file)  # a raw file where a prepared dataset goes
    parts = tmp_path / "parts"
    parts.mkdir()
    pl.read_csv(csv_file).write_parquet(parts / "part-0.parquet")
    with pytest.raises(DataError, match=r"a table of Parquet parts: prepare it first"):
        PreparedDataset(parts)
    ds = prepare(csv_file, tmp_path / "out")
    with pytest.raises(ValueError, match="split must be one of"):
        ds.split("valid")
    (ds.path / "test_te.npz").unlink()
    with pytest.raises(DataError, match="missing"):
        ds.split("test_te")
    (ds.path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="corrupted"):
        PreparedDataset(ds.path)


# --------------------------------------------------------------------------------------------
# 3. Atomicity
# --------------------------------------------------------------------------------------------


def _failing_save_csr(monkeypatch, fail_on: int = 3):
    real = prep.save_csr
    calls = {"n": 0}

    def save_csr(path, m):
        calls["n"] += 1
        if calls["n"] == fail_on:
            Path(path).write_bytes(b"half a file")  # something partial in the temp dir
            raise OSError("disk full (simulated)")
        real(path, m)

    monkeypatch.setattr(prep, "save_csr", save_csr)
    return calls


def test_failed_write_leaves_nothing_behind(csv_file, tmp_path, monkeypatch):
    parent = tmp_path / "parent"
    parent.mkdir()
    calls = _failing_save_csr(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        prepare(csv_file, parent / "out")
    assert calls["n"] == 3
    assert list(parent.iterdir()) == []  # no output, no .out.*.tmp


def test_failed_overwrite_keeps_the_old_dataset(csv_file, tmp_path, monkeypatch):
    parent = tmp_path / "parent"
    out = parent / "out"
    old = prepare(csv_file, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _failing_save_csr(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        prepare_csv(
            csv_file, out, "userId", "movieId", "rating", settings=settings(seed=2), overwrite=True
        )
    assert [p.name for p in parent.iterdir()] == ["out"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert PreparedDataset(out).fingerprint == old.fingerprint


# --------------------------------------------------------------------------------------------
# 4. Bad input
# --------------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _rows(n_users: int = 8, n_items: int = 6) -> list[str]:
    return [f"{u},{i},4.5" for u in range(1, n_users + 1) for i in range(1, n_items + 1)]


def test_missing_column_lists_the_available_ones(tmp_path):
    path = _write(tmp_path / "r.csv", "user,item,stars,when\n1,2,4.0,5\n")
    with pytest.raises(DataError) as e:
        prepare_csv(path, tmp_path / "out", "userId", "item", "stars")
    msg = str(e.value)
    assert "userId" in msg
    for col in ("user", "item", "stars", "when"):
        assert f"'{col}'" in msg
    assert not (tmp_path / "out").exists()


def test_missing_column_with_wrong_separator_hints_at_sep(tmp_path):
    path = _write(tmp_path / "r.csv", "userId\tmovieId\n1\t2\n")
    with pytest.raises(DataError, match="--sep"):
        prepare_csv(path, tmp_path / "out", "userId", "movieId", sep=",")
    ds = prepare_csv(
        _write(
            tmp_path / "ok.csv",
            "userId\tmovieId\n"
            + "\n".join(r.rsplit(",", 1)[0].replace(",", "\t") for r in _rows()),
        ),
        tmp_path / "out",
        "userId",
        "movieId",
        sep="\\t",
        settings=PrepareSettings(heldout_users=1),
    )
    assert ds.manifest["counts"]["n_users"] == 8


def test_columns_not_given_are_found_by_name_or_refused_with_the_list(tmp_path):
    """As vaecf.fit reads a file: MovieLens' userId/movieId/rating found without flags (the
    ratings where --min-rating asks for them); unknown names are refused with the columns."""
    path = _write(tmp_path / "r.csv", "userId,movieId,rating\n" + "\n".join(_rows()) + "\n")
    settings = PrepareSettings(min_rating=4, heldout_users=1)
    ds = prepare_csv(path, tmp_path / "out", settings=settings)
    assert ds.manifest["source"]["columns"] == {
        "user": "userId",
        "item": "movieId",
        "rating": "rating",
    }
    assert ds.manifest["counts"]["n_users"] == 8
    bom = tmp_path / "excel.csv"  # a spreadsheet's UTF-8 byte-order mark before the header
    bom.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    again = prepare_csv(bom, tmp_path / "bom", settings=settings)
    assert again.manifest["source"]["columns"] == ds.manifest["source"]["columns"]
    odd = _write(tmp_path / "odd.csv", "who,what,grade\n" + "\n".join(_rows()) + "\n")
    with pytest.raises(DataError, match=r"user_col= \(the columns: \[.who."):
        prepare_csv(odd, tmp_path / "odd")
    with pytest.raises(DataError, match=r"holds the ratings: rating_col="):
        prepare_csv(odd, tmp_path / "odd", "who", "what", settings=settings)
    assert not (tmp_path / "odd").exists()
    # a wrong name into a directory prepared before: the name's error, not "pass --overwrite"
    with pytest.raises(DataError, match=r"user_col= 'whoo' is not a column.*'who', 'what'"):
        prepare_csv(odd, tmp_path / "out", "whoo", "what", "grade", settings=settings)
    with pytest.raises(DataError, match=r"rating_col= 'stars' is not a column"):
        prepare_csv(odd, tmp_path / "out", "who", "what", "stars")


def test_empty_file(tmp_path):
    path = _write(tmp_path / "r.csv", "")
    with pytest.raises(DataError, match="empty"):
        prepare_csv(path, tmp_path / "out", "userId", "movieId")


def test_header_only_file(tmp_path):
    path = _write(tmp_path / "r.csv", "userId,movieId,rating\n")
    with pytest.raises(DataError, match="header but no rows"):
        prepare_csv(path, tmp_path / "out", "userId", "movieId", "rating")


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        prepare_csv(tmp_path / "nope.csv", tmp_path / "out", "userId", "movieId")


def test_unparsable_rating_names_the_data_row(tmp_path):
    rows = _rows()
    rows[6] = "1,7,four"  # data row 7
    path = _write(tmp_path / "r.csv", "userId,movieId,rating\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataError) as e:
        prepare_csv(
            path,
            tmp_path / "out",
            "userId",
            "movieId",
            "rating",
            settings=PrepareSettings(min_rating=4, heldout_users=1),
        )
    msg = str(e.value)
    assert "data row 7" in msg and "four" in msg and "'rating'" in msg


def test_empty_user_id_names_the_data_row(tmp_path):
    rows = _rows()
    rows[11] = ",3,4.5"  # data row 12
    path = _write(tmp_path / "r.csv", "userId,movieId,rating\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"data row 12: empty 'userId'"):
        prepare_csv(path, tmp_path / "out", "userId", "movieId", "rating")


def test_too_few_users_for_heldout_split(tmp_path):
    path = _write(tmp_path / "r.csv", "userId,movieId,rating\n" + "\n".join(_rows(8)) + "\n")
    with pytest.raises(DataError) as e:
        prepare_csv(
            path,
            tmp_path / "out",
            "userId",
            "movieId",
            "rating",
            settings=PrepareSettings(heldout_users=4),
        )
    msg = str(e.value)
    assert "heldout_users=" in msg and "8 users" in msg and "at most 3" in msg
    assert not (tmp_path / "out").exists()
    ds = prepare_csv(
        path,
        tmp_path / "out",
        "userId",
        "movieId",
        "rating",
        settings=PrepareSettings(heldout_users=3),
    )
    assert ds.manifest["counts"]["n_train_users"] == 2


def test_nothing_left_after_filtering(tmp_path):
    path = _write(tmp_path / "r.csv", "userId,movieId,rating\n" + "\n".join(_rows(8, 3)) + "\n")
    with pytest.raises(DataError, match="no interactions remain"):
        prepare_csv(
            path,
            tmp_path / "out",
            "userId",
            "movieId",
            "rating",
            settings=PrepareSettings(heldout_users=1),
        )


def test_min_rating_without_rating_column(tmp_path):
    path = _write(
        tmp_path / "r.csv",
        "userId,movieId\n" + "\n".join(r.rsplit(",", 1)[0] for r in _rows()) + "\n",
    )
    with pytest.raises(DataError, match="rating_col="):
        prepare_csv(
            path,
            tmp_path / "out",
            "userId",
            "movieId",
            settings=PrepareSettings(min_rating=4, heldout_users=1),
        )
    frame = pl.DataFrame({"user_id": [1, 2], "item_id": [1, 2]})
    with pytest.raises(DataError, match="rating_col="):
        prepare_frame(frame, tmp_path / "out", PrepareSettings(min_rating=4, heldout_users=1))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(protocol="paper"), "protocol"),
        (dict(min_user_items=0), "min_user_items="),
        (dict(min_item_users=-1), "min_item_users="),
        (dict(target_frac=1.0), "target fraction"),
        (dict(heldout_users=0), "heldout_users="),
        (dict(protocol="thesis", validation_frac=0.001), "too few"),
    ],
)
def test_bad_settings(tmp_path, kw, match):
    path = _write(
        tmp_path / "r.csv",
        "userId,movieId\n" + "\n".join(r.rsplit(",", 1)[0] for r in _rows()) + "\n",
    )
    with pytest.raises(DataError, match=match):
        prepare_csv(path, tmp_path / "out", "userId", "movieId", settings=PrepareSettings(**kw))


# --------------------------------------------------------------------------------------------
# 7. Fold-in split
# --------------------------------------------------------------------------------------------


def reference_fold_in(sizes, seed, test_prop=0.2, min_items=5) -> np.ndarray:
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        parts = []
        for n in sizes:
            idx = np.zeros(n, dtype="bool")
            if n >= min_items:
                pick = np.random.choice(n, size=int(test_prop * n), replace=False)
                idx[pick.astype("int64")] = True
            parts.append(idx)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
    finally:
        np.random.set_state(state)


@pytest.mark.parametrize("seed", [98765, 0, 1, 2024])
@pytest.mark.parametrize("test_prop", [0.2, 0.1, 0.5])
def test_fold_in_mask_matches_reference_loop(seed, test_prop):
    rng = np.random.default_rng(seed)
    sizes = np.concatenate([rng.integers(1, 12, 150), rng.integers(12, 300, 50)])
    rng.shuffle(sizes)
    mask = splits.fold_in_mask(sizes, seed, test_prop)
    np.testing.assert_array_equal(mask, reference_fold_in(sizes, seed, test_prop))
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    per_user = np.add.reduceat(mask.astype(int), starts)
    want = np.where(sizes >= 5, (test_prop * sizes).astype(int), 0)
    np.testing.assert_array_equal(per_user, want)


def test_fold_in_mask_min_items_and_global_rng_untouched():
    sizes = np.array([3, 4, 5, 9, 2, 30])
    state = np.random.get_state()
    np.random.seed(1)
    before = np.random.get_state()[1].copy()
    mask = splits.fold_in_mask(sizes, 98765, 0.2, min_items=4)
    np.testing.assert_array_equal(mask, reference_fold_in(sizes, 98765, 0.2, min_items=4))
    np.testing.assert_array_equal(np.random.get_state()[1], before)
    np.random.set_state(state)
    assert splits.fold_in_mask(np.array([], dtype=np.int64), 1).size == 0


def test_shuffle_users_is_the_papers_permutation():
    ids = np.array([3, 8, 15, 16, 23, 42, 108, 4815])
    state = np.random.get_state()
    np.random.seed(98765)
    want = ids[np.random.permutation(ids.size)]
    np.random.set_state(state)
    np.testing.assert_array_equal(splits.shuffle_users(ids, 98765), want)


def test_heldout_counts():
    assert splits.heldout_counts_liang(100, 10) == (80, 10, 10)
    with pytest.raises(DataError, match="at most 49"):
        splits.heldout_counts_liang(100, 50)
    assert splits.heldout_counts_percent(1000, 0.07, 0.07) == (860, 70, 70)
    with pytest.raises(DataError):
        splits.heldout_counts_percent(10, 0.01, 0.07)


def test_no_temp_files_anywhere(tmp_path, csv_file):
    prepare(csv_file, tmp_path / "out")
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(".")]
    assert leftovers == []
    assert os.listdir(tmp_path) == ["out"]


def test_a_directory_of_parquet_parts_prepares_and_its_parts_are_its_fingerprint(tmp_path):
    """A table written as Parquet parts prepares like one file; the same parts reuse the
    dataset, a changed part is another source (refused without --overwrite)."""
    rows = pl.read_csv(_write(tmp_path / "all.csv", "userId,movieId,rating\n" + "\n".join(_rows())))
    table = tmp_path / "table"
    table.mkdir()
    half = rows.height // 2
    rows[:half].write_parquet(table / "part-0.parquet")
    rows[half:].write_parquet(table / "part-1.parquet")
    settings = PrepareSettings(heldout_users=2)
    whole = prepare_csv(tmp_path / "all.csv", tmp_path / "a", settings=settings)
    parts = prepare_csv(table, tmp_path / "b", settings=settings)
    assert parts.manifest["counts"] == whole.manifest["counts"]
    assert parts.manifest["source"]["format"] == "parquet"
    assert prepare_csv(table, tmp_path / "b", settings=settings).path == parts.path  # reused
    rows[half:].head(3).write_parquet(table / "part-1.parquet")
    with pytest.raises(DataError, match="with other settings or source"):
        prepare_csv(table, tmp_path / "b", settings=settings)


def test_prepare_csv_without_heldout_users_holds_out_7_percent_each(tmp_path, capsys):
    """The CLI's default split of a file of one's own: 7% + 7% of the users (the thesis
    protocol, as the named small datasets); --heldout-users N gives the paper's N + N."""
    from vaecf.cli import main

    path = _write(tmp_path / "r.csv", "userId,movieId,rating\n" + "\n".join(_rows()))
    assert main(["prepare", "csv", "--path", str(path), "--out", str(tmp_path / "a")]) == 0
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    c = m["counts"]
    assert m["settings"]["protocol"] == "thesis" and m["settings"]["heldout_users"] is None
    assert c["n_validation_users"] == c["n_test_users"] == round(0.07 * c["n_users"])
    args = ["--path", str(path), "--heldout-users", "2", "--out", str(tmp_path / "b")]
    assert main(["prepare", "csv", *args]) == 0
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["settings"]["protocol"] == "liang" and m["counts"]["n_test_users"] == 2
