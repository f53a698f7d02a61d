"""Issue 39, items 4, 5, 6 and 9: a raw id has one spelling (Python, CLI, HTTP alike); item names
have a length limit and answers a byte cap; the docs pages fetch nothing from another site; /readyz
names no model to a foreign Host; the CLI prints names and ids with control characters escaped;
the dependency floors sit past known advisories."""

from __future__ import annotations

import polars as pl
import pytest
from serve_helpers import client, running

from vaecf.cli import main
from vaecf.recommender import Recommender
from vaecf.score import score_file
from vaecf.serve.fixtures import fresh_run
from vaecf.serve.settings import ServeSettings

IDS = [0, 7, 10, 11, *range(100, 116)]
TINY = {"hidden_dims": [8], "latent_dim": 4}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return fresh_run(tmp_path_factory.mktemp("ids") / "run", len(IDS), "multvae", TINY, IDS)


# -- 4. one spelling per id -----------------------------------------------------------------------
ODD = ["010", "-0", "00", "+10", "0010", "-010", "1" + "0" * 30]


def test_an_integer_id_has_one_spelling(run, tmp_path, capsys):
    rec = Recommender.load(run)
    r = rec.recommend(["10", "0", *ODD], k=3)
    assert r.unknown == ODD
    assert rec.recommend(["7", "-0"], k=3).unknown == ["-0"]
    assert rec.similar_items("010").unknown == ["010"]
    assert rec.similar_items("10").unknown == []
    assert main(["similar", str(run), "--item", "010"]) != 0
    assert "'010' is not in the model's vocabulary" in capsys.readouterr().err
    with running(ServeSettings(run=str(run))) as (base, _), client(base) as c:
        assert c.get("/v1/items/010/similar").status_code == 404
        assert c.get("/v1/items/-0/similar").status_code == 404
        assert c.get("/v1/items/10/similar").json()["item_id"] == 10
        body = c.post("/v1/recommend", json={"items": ["010", "-0", 10], "k": 2}).json()
    assert body["unknown"] == ["010", "-0"]
    # vaecf score reads ids from a text column by the same rule: "010" is no item
    pl.DataFrame({"u": [1, 1, 2], "i": ["10", "0", "010"]}).write_parquet(tmp_path / "in.parquet")
    score_file(rec, tmp_path / "in.parquet", "u", "i", tmp_path / "out.parquet", k=2)
    got = pl.read_parquet(tmp_path / "out.parquet")
    want = rec.recommend_batch([["10", "0"], ["010"]], 2)
    assert got.get_column("item_id").to_list() == [i for r in want for i in r.item_ids]
    assert want[1].fallback == "popular"
