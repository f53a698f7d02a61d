"""Issue 39, items 4, 5, 6 and 9: a raw id has one spelling (Python, CLI, HTTP alike); item names
have a length limit and answers a byte cap; the docs pages fetch nothing from another site; /readyz
names no model to a foreign Host; the CLI prints names and ids with control characters escaped;
the dependency floors sit past known advisories."""

from __future__ import annotations

import json
import re
import tomllib
from importlib import metadata
from pathlib import Path

import polars as pl
import pytest

from tests.serve.helpers import client, running
from vaecf.cli import main
from vaecf.config.serve import ServeSettings
from vaecf.data.prepare import PrepareSettings, prepare_frame
from vaecf.data.vocab import MAX_NAME_CHARS
from vaecf.recommender import Recommender
from vaecf.score import score_file
from vaecf.serve.fixtures import fresh_run
from vaecf.serve.page import PAGE_PATHS

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


# -- 5. name length and answer bytes --------------------------------------------------------------
LONG = "x" * 20_000


def test_prepare_cuts_long_names_and_says_so(tmp_path, capsys):
    rows = [(u, i) for u in range(30) for i in range(8) if (u + i) % 3]
    df = pl.DataFrame(rows, schema={"user_id": pl.Int64, "item_id": pl.Int64}, orient="row")
    names = pl.DataFrame({"item_id": [0, 1, 2], "name": [LONG, "short", "é" * MAX_NAME_CHARS]})
    settings = PrepareSettings(heldout_users=4, min_user_items=1, min_item_users=1)
    ds = prepare_frame(df, tmp_path / "p", settings, {}, names)
    assert ds.manifest["counts"]["n_names_cut"] == 1
    got = ds.item_names()
    assert got[0] == "x" * (MAX_NAME_CHARS - 1) + "\u2026" and len(got[0]) == MAX_NAME_CHARS
    assert got[1] == "short" and got[2] == "é" * MAX_NAME_CHARS  # at the limit: kept whole
    assert main(["info", str(ds.path)]) == 0
    assert f"1 item names cut to {MAX_NAME_CHARS} characters" in capsys.readouterr().out


@pytest.fixture(scope="module")
def long_named(tmp_path_factory):
    """A run whose names were written before the limit: 20,000 characters each."""
    out = fresh_run(tmp_path_factory.mktemp("long") / "run", len(IDS), "multvae", TINY, IDS)
    pl.DataFrame({"item_id": IDS, "name": [f"{i}:{LONG}" for i in IDS]}).write_parquet(
        out / "item_names.parquet"
    )
    return out


def test_names_prepared_before_the_limit_are_cut_on_loading(long_named, caplog):
    with caplog.at_level("WARNING", logger="vaecf"):
        rec = Recommender.load(long_named)
    assert {len(n) for n in rec.names.values()} == {MAX_NAME_CHARS}
    assert f"{len(IDS)} item names" in caplog.text and "cut to 500" in caplog.text


def test_answers_have_a_byte_cap_with_a_422_that_says_what_fits(long_named):
    settings = ServeSettings(run=str(long_named), max_answer_bytes=6000)
    with running(settings) as (base, _), client(base) as c:
        big = c.post("/v1/recommend", json={"items": [0], "k": 15})
        small = c.post("/v1/recommend", json={"items": [0], "k": 5})
        batch = c.post("/v1/recommend/batch", json={"histories": [[0], [7], [10]], "k": 5})
        similar = c.get("/v1/items/10/similar", params={"k": 15})
    assert small.status_code == 200 and len(small.content) <= 6000
    for r in (big, batch, similar):
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["error"] == "answer_too_large" and body["limits"]["max_answer_bytes"] == 6000
        assert "ask for fewer histories or a smaller k" in body["message"]
        assert "max_answer_bytes=6000" in body["message"]
    assert ServeSettings().max_answer_bytes == 8 << 20


# -- 6. pages fetch nothing from another site -----------------------------------------------------
URL = re.compile(r"(?:https?:)?//[A-Za-z0-9-]+\.[A-Za-z0-9.-]+")  # a link to another host


def test_every_page_is_self_hosted_under_a_csp(run):
    with running(ServeSettings(run=str(run))) as (base, _), client(base) as c:
        spec = c.get("/openapi.json").json()  # what /docs draws, and schemathesis reads
        assert "/v1/recommend" in spec["paths"]
        routes = [p for p, ops in spec["paths"].items() if "get" in ops and "{" not in p]
        assert c.get("/redoc").status_code == 404
        pages = []
        for path in dict.fromkeys(["/docs", "/openapi.json", *PAGE_PATHS, *routes]):
            r = c.get(path)
            assert r.status_code == 200 or path not in ("/docs", *PAGE_PATHS), path
            assert not URL.findall(r.text), (path, URL.findall(r.text)[:3])
            if r.headers["content-type"].startswith("text/html"):
                pages.append(path)
                csp = r.headers.get("content-security-policy", "")
                assert "default-src 'none'" in csp and "script-src 'self'" in csp, path
                for src in re.findall(r'(?:src|href)="([^"]+)"', r.text):
                    assert src.startswith("/") and c.get(src).status_code == 200, src
    assert sorted(pages) == ["/", "/docs"]


# -- 9. /readyz is a probe; printed names are escaped; dependency floors --------------------------
def test_readyz_names_no_model_to_a_foreign_host(run):
    with running(ServeSettings(run=str(run))) as (base, _), client(base) as c:
        own = c.get("/readyz").json()
        foreign = c.get("/readyz", headers={"Host": "attacker.example"})
        assert c.get("/v1/model", headers={"Host": "attacker.example"}).status_code == 421
    assert own["ready"] is True and own["model"]["name"] == "multvae"
    assert foreign.status_code == 200 and foreign.json() == {"ready": True}


ESC = "\x1b]0;owned\x07\x1b[31mRed\x1b[0m"  # sets a terminal's title, then its colour


def test_the_cli_prints_names_and_ids_with_control_characters_escaped(run, tmp_path, capsys):
    out = fresh_run(tmp_path / "run", len(IDS), "multvae", TINY, IDS)
    names = [f"{ESC} {i}\u202e" for i in IDS]
    pl.DataFrame({"item_id": IDS, "name": names}).write_parquet(out / "item_names.parquet")
    assert main(["recommend", str(out), "--items", "0,7,x\x1b[2J", "-k", "3"]) == 0
    assert main(["similar", str(out), "--item", "10", "-k", "3"]) == 0
    got = capsys.readouterr()
    for text in (got.out, got.err):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert got.out.count("\\x1b]0;owned\\x07\\x1b[31mRed\\x1b[0m") == 7  # 3 + 1 + 3 names
    assert "x\\x1b[2J" in got.err  # the unknown id, escaped too
    assert main(["recommend", str(out), "--items", "0", "-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"][0]["title"].startswith(ESC)  # exact


FLOORS = {"orjson": (3, 9, 15), "fastapi": (0, 115), "starlette": (0, 40), "h11": (0, 16)}


def _version(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def test_dependency_floors_are_past_known_advisories():
    with open(Path(__file__).parents[1] / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    for extra in ("serve", "dev"):
        floors = {}
        for req in extras[extra]:
            m = re.fullmatch(
                r"([A-Za-z0-9_-]+)(?:\[[^]]*\])?>=([0-9.]+)", req.split(";")[0].strip()
            )
            if m:
                floors[m.group(1).lower()] = _version(m.group(2))
        for name, least in FLOORS.items():
            assert floors.get(name, ()) >= least, (extra, name, floors.get(name))
            assert _version(metadata.version(name)) >= floors[name], name  # what is installed
