"""Item names end to end: kept by prepare (a user's file, MovieLens movies.csv/.dat, Last.fm's
artist column), checked by the manifest, copied into the run, shown by recommend/similar (Python,
CLI) and returned by the HTTP API."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest

from tests.serve.helpers import client, running
from vaecf import rundir
from vaecf.cli import main
from vaecf.config.serve import ServeSettings
from vaecf.data.prepare import (
    ITEM_NAMES,
    PreparedDataset,
    PrepareSettings,
    dataset_settings,
    prepare_csv,
    prepare_dataset,
)
from vaecf.errors import DataError
from vaecf.recommender import Recommender
from vaecf.serve.fixtures import fresh_run

N_USERS, ITEMS = 80, list(range(1, 31))
COMMA = "American President, The (1995)"  # quoted in the file: it holds a comma
SETTINGS = dict(min_rating=4.0, heldout_users=10)


def _ratings(rng: random.Random) -> list[tuple[int, int, float]]:
    rows = []
    for u in range(1, N_USERS + 1):
        for i in sorted(rng.sample(ITEMS, rng.randint(6, 12))):
            rows.append((u, i, rng.choice([4.0, 5.0, 4.5])))
    return rows


def _movielens_files(d: Path) -> Path:
    """ratings.csv + movies.csv in MovieLens' format: every item named but 30; 9999 unrated."""
    d.mkdir(parents=True, exist_ok=True)
    lines = ["userId,movieId,rating,timestamp"]
    lines += [f"{u},{i},{r},964982703" for u, i, r in _ratings(random.Random(7))]
    (d / "ratings.csv").write_text("\n".join(lines) + "\n")
    movies = ["movieId,title,genres", f'1,"{COMMA}",Comedy|Drama|Romance']
    movies += [f"{i},Film {i} ({1990 + i}),Drama" for i in ITEMS[1:-1]]
    movies += ["9999,Never Rated (2001),Drama"]
    (d / "movies.csv").write_text("\n".join(movies) + "\n", encoding="utf-8")
    return d


def _prepare(d: Path, out: Path, **kw) -> PreparedDataset:
    return prepare_csv(
        d / "ratings.csv",
        out,
        "userId",
        "movieId",
        "rating",
        settings=PrepareSettings(**SETTINGS),
        **kw,
    )


@pytest.fixture(scope="module")
def named(tmp_path_factory) -> PreparedDataset:
    root = tmp_path_factory.mktemp("names")
    d = _movielens_files(root / "raw")
    return _prepare(d, root / "prepared", item_names=d / "movies.csv", name_col="title")


@pytest.fixture(scope="module")
def run(named, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "ease"
    rc = main(["train", "--data", str(named.path), "--model", "ease", "--out", str(out), "--quiet"])
    assert rc == 0
    return out


# -- prepare -------------------------------------------------------------------------------------
def test_names_survive_prepare_typed_like_the_vocabulary(named):
    names = named.item_names()
    vocab = set(named.items.ids.to_list())
    assert names is not None and set(names) <= vocab
    assert all(isinstance(k, int) for k in names)  # ints stay ints
    assert names[1] == COMMA and names[2] == "Film 2 (1992)"
    assert 9999 not in names and 30 not in names  # unrated; unnamed
    assert len(names) == len(vocab - {30}) == named.manifest["counts"]["n_named_items"]
    assert ITEM_NAMES in named.manifest["files"]


def test_names_file_is_part_of_the_fingerprint(named, tmp_path):
    d = _movielens_files(tmp_path / "raw")
    plain = _prepare(d, tmp_path / "plain")
    assert plain.item_names() is None and plain.item_names_file() is None
    assert plain.fingerprint != named.fingerprint
    movies = d / "movies.csv"
    first = _prepare(d, tmp_path / "n", item_names=movies, name_col="title")
    assert first.fingerprint == named.fingerprint  # same files, same settings
    movies.write_text(movies.read_text().replace("Film 2 (1992)", "Film Two (1992)"))
    with pytest.raises(DataError, match="other settings or source"):
        _prepare(d, tmp_path / "n", item_names=movies, name_col="title")


def test_tampered_names_are_refused(named, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(named.path, copy)
    pl.DataFrame({"item_id": [1], "name": ["Something Else"]}).write_parquet(copy / ITEM_NAMES)
    with pytest.raises(DataError, match="item_names.parquet is corrupted"):
        PreparedDataset(copy).item_names()
    with pytest.raises(DataError, match="item_names.parquet is corrupted"):
        PreparedDataset(copy).verify()


def test_names_matching_no_item_is_an_error(tmp_path):
    d = _movielens_files(tmp_path / "raw")
    other = tmp_path / "names.tsv"
    other.write_text("id\tname\na1\tNobody\n")
    with pytest.raises(DataError, match="none of the 1 ids in .*names.tsv.*--name-id-col"):
        _prepare(d, tmp_path / "o", item_names=other, name_col="name", name_id_col="id")


def test_registry_movielens_reads_movies_csv_beside_ratings(tmp_path):
    d = _movielens_files(tmp_path / "ml")
    settings = dataset_settings("ml-latest-small", protocol="liang", heldout_users=10)
    ds = prepare_dataset("ml-latest-small", d, tmp_path / "a", settings, progress=False)
    assert ds.item_names()[1] == COMMA
    assert ds.manifest["source"]["item_names"]["path"].endswith("movies.csv")
    # a malformed movies.csv: the file and its line are named
    (d / "movies.csv").write_text("movieId,title,genres\n1,Fine (1995),Drama\n2,no genres\n")
    with pytest.raises(DataError, match=r"movies.csv, line 3: '2,no genres'"):
        prepare_dataset("ml-latest-small", d, tmp_path / "b", settings, progress=False)
    (d / "movies.csv").unlink()  # no names file: no names
    ds = prepare_dataset("ml-latest-small", d, tmp_path / "c", settings, progress=False)
    assert ds.item_names() is None


def test_registry_ml1m_reads_latin1_movies_dat(tmp_path):
    d = tmp_path / "ml-1m"
    d.mkdir()
    rows = _ratings(random.Random(3))
    (d / "ratings.dat").write_text("".join(f"{u}::{i}::{int(r)}::978300760\n" for u, i, r in rows))
    titles = {i: f"Film {i} (1999)" for i in ITEMS}
    titles[1] = "Misérables, Les (1995)"
    dat = "".join(f"{i}::{t}::Drama\n" for i, t in titles.items())
    (d / "movies.dat").write_bytes(dat.encode("latin-1"))
    settings = dataset_settings("ml-1m", protocol="liang", heldout_users=10)
    ds = prepare_dataset("ml-1m", d, tmp_path / "out", settings, progress=False)
    assert ds.item_names()[1] == "Misérables, Les (1995)"


def test_lastfm_keeps_an_artists_first_spelling(tmp_path):
    rng = random.Random(5)
    mbid = {i: f"{i:08x}-0000-4000-8000-{i:012x}" for i in ITEMS}
    lines = ["user000\t\tNo MBID Band\t7"]
    lines += [f"user000\t{mbid[i]}\tArtist {i}\t3" for i in ITEMS]  # the first spellings
    for u in range(1, N_USERS):
        for i in rng.sample(ITEMS, rng.randint(6, 12)):
            lines.append(f"user{u:03d}\t{mbid[i]}\t ARTIST {i} \t{rng.randint(1, 50)}")
    path = tmp_path / "usersha1-artmbid-artname-plays.tsv"
    path.write_text("\n".join(lines) + "\n")
    settings = dataset_settings("lastfm-360k", protocol="liang", heldout_users=10)
    ds = prepare_dataset("lastfm-360k", path, tmp_path / "out", settings, progress=False)
    names, vocab = ds.item_names(), ds.items.ids.to_list()
    assert set(names) == set(vocab)
    assert all(names[mbid[i]] == f"Artist {i}" for i in ITEMS if mbid[i] in names)
    assert names.get("name:No MBID Band", "No MBID Band") == "No MBID Band"


# -- the run, recommend, similar -----------------------------------------------------------------
def test_run_dir_carries_the_names_and_recommendations_show_them(named, run):
    assert (run / rundir.ITEM_NAMES).is_file()
    rec = Recommender.load(run)
    assert rec.names == named.item_names()
    r = rec.recommend([2, 3, 4], k=5)
    assert r.titles == [rec.names.get(i) for i in r.item_ids] and len(r.titles) == 5
    assert [it["title"] for it in r.to_dict()["items"]] == r.titles
    s = rec.similar_items(1, k=4)
    assert s.titles == [rec.names.get(i) for i in s.item_ids]


def test_cli_prints_a_title_column(run, capsys):
    rec = Recommender.load(run)
    assert main(["similar", str(run), "--item", "1", "-k", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"most similar to 1: {COMMA}"
    assert out[1].split() == ["rank", "item_id", "score", "title"]
    want = rec.similar_items(1, k=3)
    for line, item, title in zip(out[2:], want.item_ids, want.titles, strict=True):
        assert line.split(None, 3)[1] == str(item) and line.endswith(f"  {title or '-'}")
    assert main(["recommend", str(run), "--items", "2,3", "-k", "2", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [i["title"] for i in body["items"]] == rec.recommend([2, 3], k=2).titles


def test_prepare_csv_item_names_missing_column_is_exit_2(tmp_path, capsys):
    d = _movielens_files(tmp_path / "raw")
    base = ["prepare", "csv", "--path", str(d / "ratings.csv"), "--user-col", "userId"]
    base += ["--item-col", "movieId", "--heldout-users", "10", "--out", str(tmp_path / "o")]
    assert main([*base, "--item-names", str(d / "movies.csv"), "--name-col", "name"]) == 2
    err = capsys.readouterr().err
    assert "no column(s) ['name']" in err and "'title'" in err and "--name-col" in err
    assert main([*base, "--item-names", str(d / "movies.csv")]) == 2
    assert "--item-names needs --name-col" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# -- the HTTP API --------------------------------------------------------------------------------
def test_api_returns_titles(tmp_path):
    ids = list(range(100, 120))
    out = fresh_run(
        tmp_path / "run", len(ids), "multvae", {"hidden_dims": [8], "latent_dim": 4}, ids
    )
    names = {i: f"Item {i}" for i in ids if i != 105}
    pl.DataFrame({"item_id": list(names), "name": list(names.values())}).write_parquet(
        out / rundir.ITEM_NAMES
    )
    with running(ServeSettings(run=str(out))) as (base, _), client(base) as c:
        body = c.post("/v1/recommend", json={"items": [101, 102], "k": 20}).json()
        titles = {i["item_id"]: i["title"] for i in body["items"]}
        assert titles[106] == "Item 106" and titles[105] is None  # unnamed: null
        sim = c.get("/v1/items/101/similar", params={"k": 3}).json()
        assert all(
            i["title"] == f"Item {i['item_id']}" for i in sim["items"] if i["item_id"] != 105
        )
        batch = c.post("/v1/recommend/batch", json={"histories": [[101]], "k": 2}).json()
        assert all("title" in i for i in batch["results"][0]["items"])


def test_names_from_compressed_json_lines_with_missing_titles(tmp_path):
    """Amazon's metadata dump (meta.jsonl.gz: asin, title, nested fields), some records
    without a title: read as (item_id, name), the missing names null."""
    import gzip
    import json

    from vaecf.data.parsers import read_names_table

    records = [{"asin": "B01", "title": "Kettle", "categories": [["Home"]]}, {"asin": "B02"}]
    p = tmp_path / "meta.jsonl.gz"
    p.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    got = read_names_table(p, "asin", "title")
    assert got.rows() == [("B01", "Kettle"), ("B02", None)]
