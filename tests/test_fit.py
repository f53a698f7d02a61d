"""vaecf.fit: a DataFrame, a CSR matrix or a file in, a Recommender out; its work kept where it
says, within its budget, and continued with resume=True."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest
import scipy.sparse as sp

import vaecf
from vaecf.errors import ConfigError, DataError
from vaecf.fitting import default_budget


def _clusters(n_users=240, n_items=40, per_user=8, seed=0) -> pd.DataFrame:
    """Two tastes: users of group g interact only with items of group g (items 0..19 or
    20..39), with a rating; a model that learns anything recommends within the group."""
    rng = np.random.default_rng(seed)
    rows = []
    half = n_items // 2
    for u in range(n_users):
        g = u % 2
        for i in rng.choice(half, per_user, replace=False):
            rows.append((1000 + u, int(g * half + i), float(rng.integers(1, 6))))
    return pd.DataFrame(rows, columns=["userId", "movieId", "rating"])


@pytest.fixture(autouse=True)
def fits_home(tmp_path, monkeypatch):
    """fit keeps its work under $VAECF_HOME/fits: here, the test's own directory."""
    monkeypatch.setenv("VAECF_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "fits"


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Temporary files go to an empty directory we can inspect; the working directory too.
    torch._dynamo is imported first: PyTorch's Adam imports it, and the import makes PyTorch's
    own cache directory (torchinductor_USER) in the temporary directory, once a process; the
    suite passed only where an earlier test of the same worker had imported it."""
    import torch._dynamo  # noqa: F401

    tdir = tmp_path / "tmp"
    tdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tdir))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tdir, cwd


def test_fit_pandas_recommends_within_taste_and_keeps_its_work_where_it_says(
    private_tmp, fits_home, capsys
):
    tdir, cwd = private_tmp
    df = _clusters()
    rec = vaecf.fit(df, model="ease", item_names={i: f"film {i}" for i in range(40)})
    assert list(tdir.iterdir()) == [] and list(cwd.iterdir()) == []  # nothing left elsewhere
    (work,) = fits_home.iterdir()
    said = capsys.readouterr().out
    assert said.startswith("vaecf.fit: columns found by name: users 'userId', items 'movieId'\n")
    assert f"kept in {work / 'run'}" in said
    # the default 60 s, less what reading and preparing the data took (more on a cold start)
    assert 50 <= int(re.search(r"within (\d+) s", said).group(1)) <= 60
    assert vaecf.Recommender.load(work / "run").recommend([0, 1], k=3).item_ids == (
        rec.recommend([0, 1], k=3).item_ids
    )
    r = rec.recommend([0, 1, 2, 3], k=5)
    assert all(0 <= i < 20 for i in r.item_ids) and not set(r.item_ids) & {0, 1, 2, 3}
    assert r.titles == [f"film {i}" for i in r.item_ids]
    r = rec.recommend([25, 30], k=5)
    assert all(20 <= i < 40 for i in r.item_ids)
    # production split: 10% of users validate, nobody is held out for test
    assert rec.results["test"] is None
    assert rec.results["validation"]["n_users"] == 24
    assert rec.info["data"]["n_train_users"] == 216


def test_fit_min_rating_and_recommend_many(private_tmp):
    df = _clusters()
    low = pd.DataFrame({"userId": [1000] * 3, "movieId": [100, 101, 102], "rating": [1.0] * 3})
    rec = vaecf.fit(pd.concat([df, low]), rating_col="rating", min_rating=3, model="popular")
    kept = df[df.rating >= 3]
    assert set(rec.items.ids.to_list()) <= set(kept.movieId)  # low ratings are not positives
    assert 100 not in rec.items.ids.to_list()
    many = rec.recommend_many({"a": [0], "b": []}, k=3)
    assert set(many) == {"a", "b"} and many["b"].fallback == "popular"
    assert rec.recommend_many([[0], [1]], k=3)[1].item_ids == rec.recommend([1], k=3).item_ids


def test_fit_polars_string_ids_and_test_share():
    df = pl.from_dict(
        {
            "user": [f"u{u}" for u in _clusters().userId],
            "item": [f"i{i}" for i in _clusters().movieId],
        }
    )
    rec = vaecf.fit(df, model="ease", test=0.2, progress=False)
    assert rec.results["test"] is not None and rec.results["test"]["n_users"] == 48
    assert all(i.startswith("i") for i in rec.recommend(["i0", "i1"], k=3).item_ids)


def test_fit_csr_matrix_ids_are_indices():
    df = _clusters()
    m = sp.csr_matrix(
        (df.rating.to_numpy(), (df.userId.to_numpy() - 1000, df.movieId.to_numpy())),
        shape=(240, 40),
    )
    rec = vaecf.fit(m, model="multvae", min_rating=2, epochs=2, progress=False)
    assert set(rec.items.ids.to_list()) <= set(range(40))
    assert len(rec.recommend([0, 1], k=4).item_ids) == 4
    with pytest.raises(DataError, match="no columns"):
        vaecf.fit(m, rating_col="rating")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_fit_from_a_file_guesses_the_id_columns(tmp_path, suffix):
    df = pl.DataFrame(_clusters().to_dict("list"))
    path = tmp_path / f"ratings{suffix}"
    df.write_csv(path) if suffix == ".csv" else df.write_parquet(path)
    rec = vaecf.fit(path, model="ease", progress=False)
    assert all(0 <= i < 20 for i in rec.recommend([0, 1, 2], k=3).item_ids)


@pytest.mark.parametrize(
    "user,item", [("reviewerID", "asin"), ("customer_id", "article_id"), ("user", "SKU")]
)
def test_fit_finds_the_id_columns_as_public_datasets_name_them(user, item):
    df = pl.DataFrame(_clusters().to_dict("list")).rename({"userId": user, "movieId": item})
    rec = vaecf.fit(df.with_columns(pl.col(item).cast(str)), model="popular", progress=False)
    assert rec.recommend(["0", "1"], k=3).unknown == []


def test_fit_a_file_without_a_header_row_by_naming_its_columns(tmp_path):
    """A header-less file (FilmTrust's, MovieLens' .dat) is refused with how to name its
    columns, quoting its first line; named, it fits like a file with a header row."""
    path = tmp_path / "ratings.txt"
    _clusters().to_csv(path, sep=" ", header=False, index=False)
    with pytest.raises(vaecf.DataError, match=r"no header row \(its first line, '1000 "):
        vaecf.fit(path, sep="whitespace", model="ease")
    rec = vaecf.fit(
        path, sep="whitespace", columns=["user", "item", "rating"], model="ease", progress=False
    )
    assert all(0 <= i < 20 for i in rec.recommend([0, 1, 2], k=3).item_ids)
    assert rec.recommend([0, 1, 2], k=3).unknown == []  # the ids are the file's, as integers
    named = vaecf.fit(
        path,
        sep="whitespace",
        user_col="who",
        item_col="what",
        columns=["who", "what", "stars"],
        rating_col="stars",
        min_rating=3,
        model="popular",
        progress=False,
    )
    assert named.recommend([0], k=3).item_ids
    with pytest.raises(vaecf.DataError, match="header-less file"):
        vaecf.fit(_clusters(), columns=["user", "item"])


def test_save_and_out_are_normal_run_directories(tmp_path):
    rec = vaecf.fit(_clusters(), model="ease", progress=False, out=tmp_path / "kept")
    want = rec.recommend([0, 1, 2], k=5)
    again = vaecf.Recommender.load(tmp_path / "kept")
    assert again.recommend([0, 1, 2], k=5).item_ids == want.item_ids
    rec.save(tmp_path / "saved")
    saved = vaecf.Recommender.load(tmp_path / "saved")
    got = saved.recommend([0, 1, 2], k=5)
    assert got.item_ids == want.item_ids and np.allclose(got.scores, want.scores)
    assert saved.results == rec.results
    assert np.array_equal(saved.popularity_counts, rec.popularity_counts)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(vaecf.RunError, match="not a run directory"):
        rec.save(tmp_path / "other")
    half = vaecf.Recommender.load(tmp_path / "saved", precision="bf16")
    with pytest.raises(ConfigError, match="fp32"):
        half.save(tmp_path / "half")


def test_evaluate_on_a_fit_without_test_users_says_what_to_do(tmp_path, capsys):
    from vaecf.cli import main

    rec = vaecf.fit(_clusters(), model="ease", l2=10.0, progress=False, out=tmp_path / "kept")
    budget = rec.info["train"]["budget"]  # the default, as the card shows it: not 80.99862...
    assert budget == round(budget, 1)
    assert main(["evaluate", str(tmp_path / "kept")]) == 2  # not "test nan" and exit 0
    err = capsys.readouterr().err
    assert "holds no test users" in err and "evaluate --split validation" in err
    assert main(["evaluate", str(tmp_path / "kept"), "--split", "validation"]) == 0
    assert f"{rec.results['validation']['n_users']} users evaluated" in capsys.readouterr().out


def test_fit_routes_settings_and_refuses_bad_input():
    df = _clusters()
    with pytest.raises(ConfigError, match="not a setting.*l2"):
        vaecf.fit(df, model="ease", epoch=3)
    with pytest.raises(DataError, match="rating_col=..."):  # no column named like a rating
        vaecf.fit(df.rename(columns={"rating": "r"}), model="popular", min_rating=3)
    with pytest.raises(DataError, match="user_col"):
        vaecf.fit(df.rename(columns={"userId": "who"}), model="ease")
    with pytest.raises(DataError, match="DataFrame"):
        vaecf.fit(42)
    with pytest.raises(DataError, match="rows have no"):
        vaecf.fit(pd.concat([df, pd.DataFrame({"userId": [None], "movieId": [3]})]))
    with pytest.raises(ConfigError, match="validation"):
        vaecf.fit(df, model="ease", validation=1.5)
    # a model setting reaches the model: EASE with a given l2 fits that l2 alone
    rec = vaecf.fit(df, model="ease", l2=123.0, progress=False, validation=30)
    assert rec.info["model"]["config"]["l2"] == 123.0
    assert rec.results["validation"]["n_users"] == 30


def test_fit_auto_by_default(private_tmp):
    tdir, _ = private_tmp
    rec = vaecf.fit(_clusters(), epochs=2, margin_z=0.0, progress=False)
    assert rec.results["auto"]["selection"]["margin_z"] == 0.0  # an Auto setting reached auto
    assert rec.info["model"]["name"] in [c["model"] for c in rec.results["auto"]["candidates"]]
    assert list(tdir.iterdir()) == []


def test_default_budget_grows_with_the_data_and_binds_the_fit(tmp_path):
    assert default_budget(35_000) == 60.0
    assert 110 < default_budget(1_000_209) < 120
    rec = vaecf.fit(
        _clusters(), model="multvae", epochs=100_000, patience=0, budget=4.0, progress=False
    )
    assert rec.results["stopped"] == "budget" and rec.results["epochs"] < 100_000


FIT_SCRIPT = """
import sys, vaecf
vaecf.fit(sys.argv[1], model="multvae", epochs=60, patience=0, batch_size=50, out=sys.argv[2])
"""


def test_an_interrupted_fit_says_how_to_resume_and_resume_continues_it(tmp_path):
    data = tmp_path / "ratings.csv"
    pl.DataFrame(_clusters(n_users=600).to_dict("list")).write_csv(data)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", FIT_SCRIPT, str(data), str(out)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 120
    while (
        not (out / "metrics.jsonl").is_file()
        or len((out / "metrics.jsonl").read_text().splitlines()) < 2
    ):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode != 0 and "resume=True" in err and str(out) in err, err
    before = (out / "metrics.jsonl").read_text().splitlines()
    assert 2 <= len(before) < 60
    with pytest.raises(vaecf.RunError, match="resume=True"):  # a named out is never overwritten
        vaecf.fit(data, model="multvae", epochs=60, patience=0, batch_size=50, out=out)
    rec = vaecf.fit(
        data,
        model="multvae",
        epochs=60,
        patience=0,
        batch_size=50,
        out=out,
        resume=True,
        budget=3600,
        progress=False,
    )
    after = (out / "metrics.jsonl").read_text().splitlines()
    assert rec.results["epochs"] == 60 and len(after) == 60
    assert [json.loads(r)["loss"] for r in after[: len(before)]] == [
        json.loads(r)["loss"] for r in before
    ]


def test_fit_reads_nullable_pandas_columns_and_a_tab_file(tmp_path):
    df = _clusters()
    df["userId"] = df["userId"].astype("Int64")  # pandas' nullable integers
    df["movieId"] = df["movieId"].astype("category")
    rec = vaecf.fit(df, model="ease", progress=False)
    assert all(0 <= i < 20 for i in rec.recommend([0, 1, 2], k=3).item_ids)
    with_na = df.copy()
    with_na.loc[0, "userId"] = pd.NA
    with pytest.raises(DataError, match="1 rows have no"):
        vaecf.fit(with_na, model="ease")
    path = tmp_path / "ratings.tsv"
    _clusters().to_csv(path, sep="\t", index=False)
    rec = vaecf.fit(path, sep="tab", model="ease", progress=False)
    assert all(0 <= i < 20 for i in rec.recommend([0, 1, 2], k=3).item_ids)


def test_min_rating_finds_the_rating_column_by_name(tmp_path):
    """As the id columns are found: min_rating alone keeps the same rows as naming the column,
    from a frame and from a file."""
    df = _clusters()
    kw = dict(model="popular", min_rating=4, progress=False, validation=30)
    named = vaecf.fit(df, rating_col="rating", **kw)
    found = vaecf.fit(df, **kw)
    df.to_csv(tmp_path / "r.csv", index=False)
    from_file = vaecf.fit(tmp_path / "r.csv", **kw)
    fingerprint = [r.info["data"]["fingerprint"] for r in (named, found, from_file)]
    assert fingerprint == [fingerprint[0]] * 3
    every = vaecf.fit(df, model="popular", progress=False, validation=30)  # no filter: other rows
    assert every.info["data"]["fingerprint"] != fingerprint[0]


def test_float_id_columns_are_the_integers_they_spell(tmp_path):
    """An integer column that held a NaN is float64 in pandas: after dropna its ids are the
    integers (13.0 is item 13, not "13.0"), from a frame, a Parquet file and item_names alike;
    a fractional id is refused by name."""
    df = _clusters()
    holed = pd.concat([df, pd.DataFrame({"userId": [1000], "movieId": [np.nan]})]).dropna()
    assert holed.movieId.dtype == np.float64
    names = pd.Series({float(i): f"film {i}" for i in range(40)})
    kw = dict(model="popular", progress=False, validation=30)
    rec = vaecf.fit(holed, item_names=names, **kw)
    assert sorted(rec.items.ids.to_list()) == list(range(40))
    answer = rec.recommend([13, 29, 39], k=3)
    assert answer.fallback is None and answer.unknown == []
    assert answer.titles == [f"film {i}" for i in answer.item_ids]
    pl.from_pandas(holed).write_parquet(tmp_path / "r.parquet")
    from_file = vaecf.fit(tmp_path / "r.parquet", **kw)
    assert from_file.recommend([13, 29, 39], k=3).item_ids == answer.item_ids
    holed.loc[holed.index[0], "movieId"] = 2.5
    with pytest.raises(DataError, match=r"'movieId', row 1: id 2\.5 is not a whole number"):
        vaecf.fit(holed, **kw)
    holed.loc[holed.index[0], "movieId"] = 8.3e128  # whole, but past 64-bit integers
    with pytest.raises(DataError, match=r"row 1: id 8\.3e\+128 is not a whole number within 64"):
        vaecf.fit(holed, **kw)


def test_fit_takes_a_dict_of_histories_or_a_list_of_pairs(tmp_path):
    """{user: [items]} and [(user, item), ...] are the same interactions: the same EASE; a
    third field is the rating that min_rating reads; malformed ones say what is expected."""
    import random

    rng = random.Random(0)
    hist = {f"u{u}": rng.sample(range(40), 8) for u in range(120)}
    pairs = [(u, i) for u, items in hist.items() for i in items]
    kw = {"model": "ease", "progress": False}
    a = vaecf.fit(hist, out=tmp_path / "a", **kw).recommend([1, 2, 3], k=5)
    b = vaecf.fit(pairs, out=tmp_path / "b", **kw).recommend([1, 2, 3], k=5)
    assert a.item_ids == b.item_ids
    rated = [(u, i, 5.0 if i % 2 else 1.0) for u, i in pairs]
    odd = vaecf.fit(rated, min_rating=4, out=tmp_path / "c", **kw)
    assert all(i % 2 for i in odd.items.ids.to_list())  # only the rows rated 5 are positives
    for bad, words in (
        ({"u1": 7}, "a dict maps each user to a list"),
        ([(1, 2), (1,)], "rows, all of one length"),
        ([], "this one is empty"),
    ):
        with pytest.raises(vaecf.DataError, match=words):
            vaecf.fit(bad, **kw)


def test_fit_holds_out_the_future_under_the_temporal_protocol(tmp_path):
    """protocol="temporal": the test is the last share of the interactions by time, found in a
    column named like a time; a frame without one is refused in one line."""
    from vaecf.data import synthetic

    rng = np.random.default_rng(4)
    df = synthetic.generate(n_users=300, n_items=60, n_groups=3, mean_items=12, seed=4)
    df = df.to_pandas()
    df["timestamp"] = rng.permutation(len(df))
    rec = vaecf.fit(df, model="ease", protocol="temporal", test=0.1, out=tmp_path / "r",
                    progress=False, min_user_items=2)  # fmt: skip
    manifest = rec.info["data"]
    ds = vaecf.PreparedDataset(manifest["path"])
    assert ds.manifest["settings"]["protocol"] == "temporal"
    assert ds.manifest["counts"]["n_test_period_pairs"] == int(np.ceil(0.1 * len(df)))
    assert rec.results["test"]["n_users"] > 0
    with pytest.raises(vaecf.DataError, match="no column named timestamp"):
        vaecf.fit(pd.DataFrame(df.drop(columns="timestamp")), protocol="temporal")
    with pytest.raises(vaecf.DataError, match="orders interactions by time"):
        vaecf.fit({1: [1, 2, 3]}, protocol="temporal")


def _digests(run) -> dict:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in run.iterdir() if p.is_file()}  # fmt: skip


def test_update_takes_a_newer_frame_of_the_same_shape_into_a_new_run(fits_home, capsys):
    """rec.update: newer data as fit read the older (same columns, same threshold): a new run
    that knows the new items, the old run unchanged, and update again from the new one."""
    df = _clusters(per_user=10)
    newer = pd.concat([df, pd.DataFrame(  # 40 new users; items 40-43 new, liked by group 0
        [(2000 + u, 40 + j % 4, 5.0) for u in range(40) for j in range(4)]
        + [(2000 + u, j, 5.0) for u in range(40) for j in range(6)],
        columns=["userId", "movieId", "rating"],
    )])  # fmt: skip
    rec = vaecf.fit(df, model="ease", min_rating=1, progress=False)
    before = _digests(Path(rec.source))
    new = rec.update(newer, progress=False)
    assert isinstance(new, vaecf.Recommender) and new.source != rec.source
    assert _digests(Path(rec.source)) == before  # never over the old run
    assert len(new.items) == 44 and len(rec.items) == 40
    assert {42, 43} <= set(new.recommend([40, 41], k=4).item_ids)  # the new items, learned
    assert rec.recommend([40, 41], k=4).unknown == [40, 41]
    assert new.info["model"]["name"] == "ease"
    assert (new.recommend([0, 1], k=5).item_ids == new.update(newer, progress=False)
            .recommend([0, 1], k=5).item_ids)  # fmt: skip
    with pytest.raises(DataError, match="not a newer preparation"):
        other = _clusters(per_user=10)  # another catalogue: the same shape, other item ids
        rec.update(other.assign(movieId=other.movieId + 500), progress=False)
