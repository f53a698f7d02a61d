"""Recommending for a known user (issue 38, item 8): `Recommender.recommend_user`, `vaecf
recommend RUN --user U` and GET /v1/users/{user_id}/recommend take the user's history from the
run's prepared dataset (a training user's training row, a held-out user's fold-in row, never
the held-out target), exclude it, and say in words when the user or the dataset is not there."""

from __future__ import annotations

import json
import shutil

import pytest

import vaecf
from tests.helpers import cpu_config
from tests.serve.helpers import client, running
from vaecf.cli import main
from vaecf.config.serve import ServeSettings
from vaecf.errors import DataError, UnknownUserError


@pytest.fixture(scope="module")
def trained(planted, tmp_path_factory):
    ds = planted("users", 300, 60, 3, 12, seed=1, heldout=30)
    run = tmp_path_factory.mktemp("users") / "run"
    vaecf.train(ds, cpu_config(), run, model="ease")
    return ds, run


def _user(ds, split: str, n: int = 0):
    """The raw id of the n-th user of `split`, and their row in that split."""
    users = ds.users
    ids = users.get_column("user_id").to_list()
    where = [i for i, s in enumerate(users.get_column("split").to_list()) if s == split]
    offset = {"train": 0, "validation": ds.manifest["counts"]["n_train_users"]}.get(split)
    if offset is None:
        c = ds.manifest["counts"]
        offset = c["n_train_users"] + c["n_validation_users"]
    return ids[where[n]], where[n] - offset


def test_a_users_history_is_their_rows_in_the_runs_data_never_their_targets(trained):
    ds, run = trained
    rec = vaecf.Recommender.load(run)
    vocab = ds.items.array
    for split, tr, te in [
        ("train", "train", None),
        ("validation", "validation_tr", "validation_te"),
        ("test", "test_tr", "test_te"),
    ]:
        user, row = _user(ds, split)
        fold_in = set(vocab[ds.split(tr)[row].indices].tolist())
        history = rec.user_history(user)
        assert set(history) == fold_in and len(history) == len(fold_in), split
        if te is not None:  # the held-out target is never part of the history
            target = set(vocab[ds.split(te)[row].indices].tolist())
            assert target and not target & set(history)
        got = rec.recommend_user(user, k=8)
        assert got.to_dict() == rec.recommend(history, k=8).to_dict()
        assert len(got.item_ids) == 8 and not set(got.item_ids) & fold_in
    # an integer-id dataset takes the id as a number or as its text
    user, _ = _user(ds, "train", 3)
    assert rec.recommend_user(str(user), k=5).item_ids == rec.recommend_user(user, k=5).item_ids


def test_an_unknown_user_is_said_in_python_on_the_command_line_and_over_http(trained, capsys):
    ds, run = trained
    rec = vaecf.Recommender.load(run)
    for nobody in (10**9, "nobody", " 3", "3.0"):
        with pytest.raises(UnknownUserError, match="is not in the run's data"):
            rec.recommend_user(nobody)
    assert main(["recommend", str(run), "--user", "nobody"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "user 'nobody' is not in the run's data" in err
    with running(ServeSettings(run=str(run))) as (base, _), client(base) as c:
        r = c.get("/v1/users/nobody/recommend")
    assert r.status_code == 404 and r.json()["error"] == "unknown_user"
    assert "'nobody' is not in the run's data" in r.json()["message"]


def test_the_command_line_recommends_for_a_user_excluding_their_history(trained, capsys):
    ds, run = trained
    rec = vaecf.Recommender.load(run)
    user, _ = _user(ds, "validation", 2)
    assert main(["recommend", str(run), "--user", str(user), "-k", "6", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == json.loads(json.dumps(rec.recommend_user(user, k=6).to_dict()))
    assert main(["recommend", str(run), "--user", str(user), "-k", "6"]) == 0
    out, err = capsys.readouterr()
    n = len(rec.user_history(user))
    assert f"user {user}: {n} items in the history" in err
    shown = [line.split()[1] for line in out.splitlines()[1:]]
    assert shown == [str(i) for i in rec.recommend_user(user, k=6).item_ids]


def test_http_recommends_for_a_user_as_python_does(trained):
    ds, run = trained
    rec = vaecf.Recommender.load(run)
    user, _ = _user(ds, "test", 1)
    with running(ServeSettings(run=str(run))) as (base, _), client(base) as c:
        body = c.get(f"/v1/users/{user}/recommend", params={"k": 7}).json()
        spec = c.get("/openapi.json").json()["paths"]["/v1/users/{user_id}/recommend"]["get"]
    want = rec.recommend_user(user, k=7).to_dict()
    assert {k: body[k] for k in want} == json.loads(json.dumps(want))
    assert body["user_id"] == user and body["history"] == len(rec.user_history(user))
    assert body["model"]["name"] == "ease" and "404" in spec["responses"]


def test_a_dataset_that_is_gone_or_another_is_said_in_words(trained, planted, tmp_path, capsys):
    ds, run = trained
    moved = tmp_path / "moved"
    shutil.copytree(ds.path, moved)
    elsewhere = tmp_path / "run"
    shutil.copytree(run, elsewhere)
    cfg = json.loads((elsewhere / "config.json").read_text())
    cfg["data"]["path"] = str(tmp_path / "gone")
    (elsewhere / "config.json").write_text(json.dumps(cfg))
    rec = vaecf.Recommender.load(elsewhere)
    user, _ = _user(ds, "train")
    with pytest.raises(DataError, match=r"prepared dataset .*gone is gone \(moved or deleted\)"):
        rec.recommend_user(user)
    assert (
        rec.recommend_user(user, data=moved).item_ids
        == rec.recommend(rec.user_history(user, data=moved)).item_ids
    )
    assert main(["recommend", str(elsewhere), "--user", str(user)]) == 2
    assert "is gone (moved or deleted)" in capsys.readouterr().err
    assert main(["recommend", str(elsewhere), "--user", str(user), "--data", str(moved)]) == 0
    other = planted("users-other", 200, 60, 3, 12, seed=2, heldout=20)
    with pytest.raises(DataError, match="holds another dataset"):
        rec.recommend_user(user, data=other.path)
    with running(ServeSettings(run=str(elsewhere))) as (base, _), client(base) as c:
        r = c.get(f"/v1/users/{user}/recommend")
    assert r.status_code == 404 and r.json()["error"] == "no_user_data"
    assert "is gone" in r.json()["message"] and str(tmp_path) not in r.json()["message"]
    fresh = vaecf.Recommender(rec.model, rec.items)  # built in memory: no dataset to look in
    with pytest.raises(DataError, match="names no prepared dataset"):
        fresh.recommend_user(user)
