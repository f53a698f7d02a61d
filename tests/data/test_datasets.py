"""Named datasets end to end: a synthetic file in each official raw format -> `prepare_dataset`
-> every split and count compared with the pandas implementation of the paper's notebook
(`paper_reference` in test_prepare.py), fed by a plain-Python reading of the same raw file.
Plus malformed rows, Last.fm's counted skips, Netflix's two layouts, and the CLI verbs.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest

from tests.data.test_prepare import assert_matches_reference, make_ratings, paper_reference
from vaecf.data import splits
from vaecf.data.prepare import SPLIT_FILES, dataset_settings, prepare_dataset
from vaecf.data.preprocess import first_pairs
from vaecf.errors import DataError

HELD = 30


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    """make_ratings' rows without its rating-changing duplicates (those are consistent only for
    thresholds 3.5 and 4.5; the registry uses 4), plus 12 exact repeats of earlier rows."""
    r = make_ratings(seed=3).drop_duplicates(["userId", "movieId"])
    return pd.concat([r, r.sample(12, random_state=0)], ignore_index=True)


def check(ds, ref: dict) -> None:
    assert_matches_reference(ds, ref)
    for key, value in ref["counts"].items():
        assert ds.manifest["counts"][key] == value, key


def prep(name: str, source, tmp_path: Path, **kw):
    settings = dataset_settings(name, **{"protocol": "liang", "heldout_users": HELD, **kw})
    return prepare_dataset(
        name, source=source, root=tmp_path / "home", settings=settings, progress=False
    )


# -- MovieLens -----------------------------------------------------------------------------------
def test_ml20m_csv_matches_reference(raw, tmp_path):
    path = tmp_path / "ratings.csv"
    raw.to_csv(path, index=False)  # exactly userId,movieId,rating,timestamp
    ds = prep("ml-20m", path, tmp_path)
    check(ds, paper_reference(pd.read_csv(path), min_rating=4.0, n_heldout=HELD))
    assert ds.path.parent == tmp_path / "home" / "prepared"
    assert ds.path.name == f"ml-20m-{ds.fingerprint}"
    src = ds.manifest["source"]
    assert src["dataset"] == "ml-20m" and src["parser"] == "movielens-csv"
    assert src["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ds.manifest["settings"]["min_rating"] == 4.0
    again = prep("ml-20m", path, tmp_path)  # same file, same settings: reused
    assert again.path == ds.path and again.manifest["created"] == ds.manifest["created"]


def test_ml_from_zip_and_directory_give_the_same_dataset(raw, tmp_path):
    d = tmp_path / "ml-25m"
    d.mkdir()
    raw.to_csv(d / "ratings.csv", index=False)
    (d / "movies.csv").write_text("movieId,title,genres\n1,Toy Story (1995),Animation\n")
    arc = tmp_path / "my-copy.zip"
    with zipfile.ZipFile(arc, "w") as z:
        z.write(d / "ratings.csv", "ml-25m/ratings.csv")
        z.write(d / "movies.csv", "ml-25m/movies.csv")
    a = prep("ml-25m", d, tmp_path)
    b = prep(
        "ml-25m",
        arc,
        tmp_path,
    )
    assert a.fingerprint == b.fingerprint and a.path == b.path
    extracted = tmp_path / "home" / "raw" / "ml-25m" / "extracted" / "my-copy.zip" / "ml-25m"
    # only what is needed: the ratings and the item names file
    assert sorted(p.name for p in extracted.iterdir()) == ["movies.csv", "ratings.csv"]
    assert a.item_names() == b.item_names() == {1: "Toy Story (1995)"}


def test_ml1m_dat_matches_reference(raw, tmp_path):
    r = raw.assign(rating=np.ceil(raw["rating"]).astype(int))  # integer stars, as ml-1m
    path = tmp_path / "ratings.dat"
    path.write_text("".join(f"{u}::{i}::{s}::{t}\n" for u, i, s, t in r.itertuples(index=False)))
    rows = [line.split("::") for line in path.read_text().splitlines()]
    ref_raw = pd.DataFrame(
        {
            "userId": [int(x[0]) for x in rows],
            "movieId": [int(x[1]) for x in rows],
            "rating": [float(x[2]) for x in rows],
        }
    )
    check(prep("ml-1m", path, tmp_path), paper_reference(ref_raw, min_rating=4.0, n_heldout=HELD))
    # the registry's own protocol for ml-1m: 86/7/7 percent of users
    ds = prepare_dataset("ml-1m", source=path, root=tmp_path / "h2", progress=False)
    n = ds.manifest["counts"]["n_users"]
    cut = splits.heldout_counts_percent(n, 0.07, 0.07)
    check(ds, paper_reference(ref_raw, min_rating=4.0, cut=cut))


@pytest.mark.parametrize(
    "text, match",
    [
        ("userId,movieId,rating,timestamp\n1,2,4.0,5\n1,3,four,6\n", "line 3: rating is 'four'"),
        ("userId,movieId,rating,timestamp\n1,2,4.0,5\n1,3,4.0\n", "line 3: 3 field"),
        ("userId,movieId,rating,timestamp\n1,2,4.0,5\n\n", "line 3: 1 field"),
        ("userId,movieId,rating,timestamp\n1,2,4.0,5,9\n", "line 2: 5 field"),
        ("user,item,rating,timestamp\n1,2,4.0,5\n", "line 1: header"),
        ("", "line 1: header"),
    ],
    ids=["bad_rating", "short_row", "blank_line", "long_row", "wrong_header", "empty"],
)
def test_ml_csv_malformed(tmp_path, text, match):
    path = tmp_path / "ratings.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=match):
        prep("ml-20m", path, tmp_path)
    assert not (tmp_path / "home" / "prepared").exists()


def test_ml_dat_malformed(tmp_path):
    path = tmp_path / "ratings.dat"
    path.write_text("1::2::5::978300760\n1::3::5::978300761\n1:4:5:978300762\n")
    with pytest.raises(DataError, match=r"line 3: '1:4:5:978300762'"):
        prep("ml-1m", path, tmp_path)


# -- Netflix -------------------------------------------------------------------------------------
def netflix_rows(raw: pd.DataFrame) -> pd.DataFrame:
    """(movie, customer, stars, date) rows, movies ascending, each movie's rows in file order."""
    r = raw.assign(
        stars=np.ceil(raw["rating"]).astype(int),
        date=pd.to_datetime(raw["timestamp"], unit="s").dt.strftime("%Y-%m-%d"),
    )
    return r.sort_values("movieId", kind="stable")


def write_mv_files(rows: pd.DataFrame, d: Path) -> list[Path]:
    d.mkdir(parents=True)
    out = []
    for movie, g in rows.groupby("movieId", sort=True):
        p = d / f"mv_{movie:07d}.txt"
        p.write_text(
            f"{movie}:\n"
            + "".join(
                f"{c},{s},{t}\n" for c, s, t in zip(g["userId"], g["stars"], g["date"], strict=True)
            )
        )
        out.append(p)
    return out


def read_blocks(paths) -> pd.DataFrame:
    """The Netflix block format, read line by line."""
    data = []
    for p in paths:
        movie = None
        for line in Path(p).read_text().splitlines():
            if line.endswith(":"):
                movie = int(line[:-1])
            else:
                c, s, _ = line.split(",")
                data.append((int(c), movie, float(s)))
    return pd.DataFrame(data, columns=["userId", "movieId", "rating"])


def test_netflix_both_layouts_match_reference(raw, tmp_path):
    rows = netflix_rows(raw)
    mv = write_mv_files(rows, tmp_path / "prize" / "training_set")
    # training_set.tar, as in the Prize archive
    tar = tmp_path / "download" / "training_set.tar"
    tar.parent.mkdir()
    with tarfile.open(tar, "w") as t:
        for p in mv:
            t.add(p, f"training_set/{p.name}")
    # the widespread re-packaging: the same blocks concatenated into combined_data_*.txt
    comb = tmp_path / "kaggle"
    comb.mkdir()
    half = len(mv) // 2
    for k, part in enumerate((mv[:half], mv[half:]), 1):
        (comb / f"combined_data_{k}.txt").write_text("".join(p.read_text() for p in part))
    ref = paper_reference(read_blocks(mv), min_rating=4.0, n_heldout=HELD)
    a = prep("netflix", tmp_path / "prize", tmp_path)
    check(a, ref)
    b = prep("netflix", tar, tmp_path)
    c = prep("netflix", comb, tmp_path)
    check(b, ref)
    check(c, ref)
    assert a.manifest["counts"] == c.manifest["counts"]
    assert a.manifest["source"]["files"]["n_files"] == len(mv)


def test_netflix_malformed(tmp_path):
    d = tmp_path / "nf"
    d.mkdir()
    (d / "combined_data_1.txt").write_text("1:\n5,3,2005-01-01\nhello world\n")
    with pytest.raises(DataError, match=r"combined_data_1.txt, line 3: 'hello world'"):
        prep("netflix", d, tmp_path)
    (d / "combined_data_1.txt").write_text("5,3,2005-01-01\n")  # rows before any movie line
    with pytest.raises(DataError, match="line 1"):
        prep("netflix", d, tmp_path)
    with pytest.raises(DataError, match="no netflix raw files.*--source"):
        prep("netflix", tmp_path / "home", tmp_path) if (
            tmp_path / "home"
        ).mkdir() is None else None


# -- Last.fm 360K --------------------------------------------------------------------------------
def test_lastfm_matches_reference_and_counts_skips(raw, tmp_path):
    users = {u: hashlib.sha1(str(u).encode()).hexdigest() for u in raw["userId"].unique()}
    items = {}
    for k, i in enumerate(sorted(raw["movieId"].unique())):
        if k % 4 == 0:  # no MBID: identified by name, which can hold anything but a tab
            items[i] = ("", f'The "Band" #{i}, naïve; ünïcode')
        else:
            items[i] = (f"{i:08x}-0000-4000-8000-{i:012x}", f"Artist {i}")
    lines = []
    for u, i, _, _ in raw.itertuples(index=False):
        mbid, name = items[i]
        lines.append(f"{users[u]}\t{mbid}\t{name}\t{(u * 31 + i) % 300}")  # some 0 plays
    dirty = [
        f"{users[raw['userId'][0]]}\tmbid\tname with\ttab\t12",  # 5 fields
        "only\ttwo",
        f"{users[raw['userId'][0]]}\t\tArtist\tmany",  # plays not a number
        "\t\tNobody\t3",
    ]  # no user
    for k, line in enumerate(dirty):
        lines.insert(50 + 97 * k, line)
    path = tmp_path / "usersha1-artmbid-artname-plays.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    parsed = []
    for line in path.read_text(encoding="utf-8").splitlines():
        f = line.split("\t")
        if len(f) != 4 or not f[0].strip() or not f[3].strip().lstrip("-").isdigit():
            continue
        item = f[1].strip() or ("name:" + f[2] if f[2].strip() else None)
        if item is not None:
            parsed.append((f[0].strip(), item, float(f[3])))
    ref_raw = pd.DataFrame(parsed, columns=["userId", "movieId", "rating"])
    ds = prep("lastfm-360k", path, tmp_path, heldout_users=20)
    ref = paper_reference(ref_raw, min_rating=1.0, n_heldout=20)
    check(ds, ref)
    assert ds.manifest["source"]["parse"] == {"n_lines": len(lines), "n_skipped_malformed": 4}
    assert any(str(x).startswith('name:The "Band"') for x in ds.items.ids.to_list())


def test_lastfm_mostly_garbage_is_an_error(tmp_path):
    path = tmp_path / "usersha1-artmbid-artname-plays.tsv"
    path.write_text("a\tb\n" * 50 + "u\t\tname\t3\n")
    with pytest.raises(DataError, match="malformed"):
        prep("lastfm-360k", path, tmp_path)


# -- Pinterest (NCF) and MSD -----------------------------------------------------------------------
def test_pinterest_matches_reference(raw, tmp_path):
    pairs = raw.drop_duplicates(["userId", "movieId"])
    last = pairs.groupby("userId").tail(1)  # NCF's leave-one-out test item
    train = pairs.drop(last.index)
    d = tmp_path / "ncf"
    d.mkdir()
    for part, df in (("train", train), ("test", last)):
        (d / f"pinterest-20.{part}.rating").write_text(
            "".join(f"{u}\t{i}\t1\t{t}\n" for u, i, _, t in df.itertuples(index=False))
        )
    ref_raw = pd.concat(
        [
            pd.read_csv(
                d / f"pinterest-20.{p}.rating",
                sep="\t",
                header=None,
                names=["userId", "movieId", "rating", "ts"],
            )
            for p in ("train", "test")
        ]
    )
    ds = prep("pinterest", d, tmp_path)
    check(ds, paper_reference(ref_raw, min_rating=None, n_heldout=HELD))
    (d / "pinterest-20.test.rating").write_text("1\t2\t1\t0\n1\t2\n")
    with pytest.raises(DataError, match="pinterest-20.test.rating, line 2: 2 field"):
        prep("pinterest", d, tmp_path)


def test_msd_matches_reference(raw, tmp_path):
    r = raw.drop_duplicates(["userId", "movieId"])
    path = tmp_path / "train_triplets.txt"
    path.write_text(
        "".join(
            f"{hashlib.sha1(str(u).encode()).hexdigest()}\tSO{i:016X}\t{1 + t % 7}\n"
            for u, i, _, t in r.itertuples(index=False)
        )
    )
    ref_raw = pd.read_csv(path, sep="\t", header=None, names=["userId", "movieId", "rating"])
    ds = prep("msd", path, tmp_path, min_item_users=3, min_user_items=8, heldout_users=20)
    check(ds, paper_reference(ref_raw, min_rating=None, min_uc=8, min_sc=3, n_heldout=20))
    path.write_text("u1\tSOA\t3\nu2\tSOB\tx\n")
    with pytest.raises(DataError, match="line 2: plays is 'x'"):
        prep("msd", path, tmp_path)


# -- de-duplication fast path --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sorted", "shuffled", "strings", "negative"])
def test_first_pairs_equals_unique_keep_first(kind):
    rng = np.random.default_rng(1)
    u, i = rng.integers(0, 50, 5000), rng.integers(0, 80, 5000)
    if kind == "sorted":
        o = np.lexsort((i, u))
        u, i = u[o], i[o]
    df = pl.DataFrame({"user_id": u - (100 if kind == "negative" else 0), "item_id": i})
    if kind == "strings":
        df = df.with_columns(pl.col("item_id").cast(pl.String))
    want = df.unique(keep="first", maintain_order=True)
    assert first_pairs(df).equals(want)
    assert first_pairs(want).equals(want)


# -- the CLI -------------------------------------------------------------------------------------
def _cli(args, env):
    p = subprocess.run(
        [sys.executable, "-m", "vaecf", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    return p


def test_cli_download_prepare_info(raw, tmp_path):
    import os

    home = tmp_path / "home"
    env = {**os.environ, "VAECF_HOME": str(home)}
    d = tmp_path / "mirror"
    d.mkdir()
    raw.to_csv(d / "ratings.csv", index=False)
    arc = d / "ml-latest-small.zip"
    with zipfile.ZipFile(arc, "w") as z:
        z.write(d / "ratings.csv", "ml-latest-small/ratings.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("userId,movieId,rating,timestamp\n1,2,x,3\n")
    common = ["--heldout-users", HELD, "--protocol", "liang", "--json", "--quiet"]
    cmds = {
        "download": ["download", "ml-latest-small", "--url", arc.as_uri(), "--json", "--quiet"],
        "prepare_src": ["prepare", "ml-20m", "--source", d / "ratings.csv", *common],
        "netflix": ["download", "netflix"],
        "bad": ["prepare", "ml-20m", "--source", bad, "--quiet"],
        "missing": ["prepare", "ml-1m", "--source", tmp_path / "nope"],
        "help": ["prepare", "netflix", "--help"],
    }
    with ThreadPoolExecutor(3) as pool:
        res = dict(zip(cmds, pool.map(lambda a: _cli(a, env), cmds.values()), strict=False))
    for name in ("download", "prepare_src", "help"):
        assert res[name].returncode == 0, (name, res[name].stderr)
    rec = json.loads(res["download"].stdout)["files"]["ml-latest-small.zip"]
    assert rec["verified"] == "none published"
    assert rec["sha256"] == hashlib.sha256(arc.read_bytes()).hexdigest()
    m = json.loads(res["prepare_src"].stdout)
    assert m["counts"]["n_validation_users"] == HELD
    assert Path(m["path"]).parent == home / "prepared"
    for name, text in (
        ("netflix", "no official download"),
        ("bad", "line 2: rating is 'x'"),
        ("missing", "does not exist"),
    ):
        assert res[name].returncode == 2, (name, res[name].stderr)
        assert text in res[name].stderr and "Traceback" not in res[name].stderr
    assert "--source" in res["help"].stdout and "--protocol" in res["help"].stdout

    # prepare from the downloaded file (no network: it is already there), then info
    cmds = {
        "prepare_dl": ["prepare", "ml-latest-small", *common],
        "info_name": ["info", "ml-20m", "--json"],
        "info_dir": ["info", m["path"]],
        "info_text": ["info", "ml-20m"],
    }
    with ThreadPoolExecutor(3) as pool:
        res = dict(zip(cmds, pool.map(lambda a: _cli(a, env), cmds.values()), strict=False))
    for name, r in res.items():
        assert r.returncode == 0, (name, r.stderr)
    m2 = json.loads(res["prepare_dl"].stdout)
    assert m2["source"]["downloads"]["ml-latest-small.zip"]["url"] == arc.as_uri()
    assert m2["counts"]["nnz_train"] == m["counts"]["nnz_train"]  # same ratings.csv inside
    info = json.loads(res["info_name"].stdout)
    assert info["files"][0]["md5"] == "cd245b17a1ae2cc31bb14903e1204af3"
    assert [p["path"] for p in info["prepared"]] == [m["path"]]
    assert f"items {m['counts']['n_items']}" in res["info_dir"].stdout
    assert "136,677" in res["info_text"].stdout and "prepared" in res["info_text"].stdout


def test_all_split_files_written(raw, tmp_path):
    path = tmp_path / "ratings.csv"
    raw.to_csv(path, index=False)
    ds = prep("ml-32m", path, tmp_path)
    assert sorted(p.name for p in ds.path.iterdir()) == sorted(
        [f"{s}.npz" for s in SPLIT_FILES] + ["items.parquet", "users.parquet", "manifest.json"]
    )
