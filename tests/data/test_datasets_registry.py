"""registry: every dataset entry is complete, consistent and carries the published facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from vaecf.data import datasets
from vaecf.data.parsers import PARSERS
from vaecf.data.prepare import PrepareSettings, dataset_settings
from vaecf.errors import DataError

PUBLISHED_MD5 = {
    "ml-20m": "cd245b17a1ae2cc31bb14903e1204af3",
    "ml-1m": "c4d9eecfca2ab87c1945afe126590906",
    "ml-25m": "6b51fb2759a8657d3bfcbfc42b592ada",
    "ml-32m": "d472be332d4daa821edc399621853b57",
}


def test_every_dataset_the_issue_names_is_registered():
    assert set(datasets.names()) == {
        "ml-20m",
        "ml-1m",
        "ml-25m",
        "ml-32m",
        "ml-latest-small",
        "netflix",
        "lastfm-360k",
        "pinterest",
        "msd",
    }


@pytest.mark.parametrize("name", datasets.names())
def test_spec_is_complete(name):
    spec = datasets.get(name)
    assert spec.parser in PARSERS
    assert spec.raw_files and spec.homepage.startswith("http") and spec.licence and spec.size
    assert spec.files or spec.manual  # either a download or instructions
    for f in spec.files:
        assert f.url.startswith(("https://", "http://")) and f.filename
        assert f.md5 is None or len(f.md5) == 32
        assert f.sha256 is None or len(f.sha256) == 64
    s = dataset_settings(name)
    assert isinstance(s, PrepareSettings)
    s.validate()


@pytest.mark.parametrize("name, md5", PUBLISHED_MD5.items())
def test_movielens_published_checksums(name, md5):
    (f,) = datasets.get(name).files
    assert f.md5 == md5
    assert f.url == f"https://files.grouplens.org/datasets/movielens/{name}.zip"


def test_paper_protocols():
    ml = dataset_settings("ml-20m")
    assert (ml.protocol, ml.heldout_users, ml.min_user_items, ml.min_item_users) == (
        "liang",
        10_000,
        5,
        0,
    )
    assert ml.min_rating == 4.0 and ml.seed == 98765  # rating > 3.5 on a half-star scale
    nf = dataset_settings("netflix")
    assert (nf.protocol, nf.heldout_users, nf.min_rating) == ("liang", 40_000, 4.0)
    msd = dataset_settings("msd")
    assert (msd.protocol, msd.heldout_users, msd.min_item_users, msd.min_user_items) == (
        "liang",
        50_000,
        200,
        20,
    )
    assert msd.min_rating is None
    th = dataset_settings("ml-20m", protocol="thesis")
    assert (th.protocol, th.validation_frac, th.test_frac) == ("thesis", 0.07, 0.07)
    assert dataset_settings("ml-1m").protocol == "thesis"


def test_known_figures_of_ml20m():
    k = datasets.get("ml-20m").known
    assert k["raw_ratings"] == 20_000_263 and k["raw_users"] == 138_493
    assert k["paper_train_users"] == 136_677 and k["paper_items"] == 20_108


def test_overrides_and_unknown_names():
    s = dataset_settings("ml-20m", heldout_users=5, seed=None, min_rating=3.0)
    assert (s.heldout_users, s.seed, s.min_rating) == (5, 98765, 3.0)
    with pytest.raises(DataError, match="unknown preprocessing setting"):
        dataset_settings("ml-20m", heldout=5)
    with pytest.raises(DataError, match="choose one of ml-20m"):
        datasets.get("ml-100m")


def test_netflix_has_no_download_and_says_how(tmp_path):
    from vaecf.data.download import download

    with pytest.raises(DataError, match="--source"):
        download(datasets.get("netflix"), tmp_path)


def test_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv("VAECF_HOME", str(tmp_path / "h"))
    assert datasets.home() == tmp_path / "h"
    assert datasets.raw_dir("ml-20m") == tmp_path / "h" / "raw" / "ml-20m"
    assert datasets.prepared_root("/x") == Path("/x") / "prepared"
    monkeypatch.delenv("VAECF_HOME")
    assert datasets.home() == Path.home() / ".cache" / "vaecf"
