"""Closed-form runs (EASE, EDLAE, inf-AE, popularity) as their users see them: the model card
(config.json, `vaecf info RUN`, GET /v1/model) shows the values the search chose, only the
training settings the model reads and no epochs; `vaecf plot` draws the search, or says in one
line that there is nothing to draw."""

from __future__ import annotations

import json

import pytest

import vaecf
from tests.helpers import cpu_config
from tests.serve.helpers import client, running
from vaecf import models, rundir
from vaecf.cli import main
from vaecf.config import toml as configfile
from vaecf.config.serve import ServeSettings
from vaecf.config.specs import ANNEAL_SETTINGS, GRADIENT_SETTINGS
from vaecf.data.matrix import CSR
from vaecf.evaluate import evaluate_model

SEARCHED = {  # a small search each: lambda and p, and beta from a grid (EDLAE); inf-AE's ridge
    "edlae": {"l2_grid": [10.0, 100.0], "dropout_grid": [0.0, 0.5], "popularity_grid": [0.0, 0.25]},
    "infae": {"ridge_grid": [0.3, 3.0, 30.0]},
}
CHOICE = {"edlae": ("l2", "dropout", "popularity_exponent"), "infae": ("ridge",)}


@pytest.fixture(scope="module")
def runs(planted, tmp_path_factory):
    ds = planted("closed", 300, 60, 4, 8, seed=1, heldout=40)
    root = tmp_path_factory.mktemp("closed")
    out = {}
    for name, settings in SEARCHED.items():
        cfg = models.config_from_dict(name, settings)
        out[name] = vaecf.train(ds, cpu_config(), root / name, cfg).run_dir
    out["popular"] = vaecf.train(ds, cpu_config(), root / "popular", model="popular").run_dir
    mv = models.config_from_dict("multvae", {"hidden_dims": [16], "latent_dim": 8})
    out["multvae"] = vaecf.train(ds, cpu_config(epochs=2, batch_size=50), root / "mv", mv).run_dir
    return ds, out


def cli(*args) -> int:
    return main([str(a) for a in args])


@pytest.mark.parametrize("name", list(SEARCHED))
def test_a_searched_fit_records_its_choice(runs, name):
    """config.json (and config.toml) hold the values the search chose, not the unset ones,
    and the model they build is the fitted one: the test split scores as results.json says."""
    ds, run = runs[0], runs[1][name]
    (record,) = rundir.read_metrics(run)
    settings = rundir.load_config(run)["model"]["config"]
    for key in CHOICE[name]:
        assert settings[key] == record[key] and settings[key] is not None
    assert settings.get("popularity_grid", []) == []  # beta is fixed at its choice
    assert (
        configfile.read(run / rundir.CONFIG_TOML).model_config[CHOICE[name][0]]
        == record[CHOICE[name][0]]
    )
    model, _ = rundir.load_model(run)
    test = [CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te")]
    got = evaluate_model(model, *test, precision="fp32")["ndcg@100"]
    assert got == pytest.approx(rundir.load_results(run)["test"]["ndcg@100"], abs=1e-6)


@pytest.mark.parametrize("name", ["edlae", "infae", "popular"])
def test_closed_form_card_has_no_epochs_and_only_its_settings(runs, name, capsys):
    run = runs[1][name]
    unread = set(GRADIENT_SETTINGS + ANNEAL_SETTINGS)
    assert not unread & set(rundir.load_config(run)["train"])  # no epochs, lr, anneal_cap
    assert cli("info", run, "--json") == 0
    card = json.loads(capsys.readouterr().out)
    assert card["closed_form"] and card["best_epoch"] is None and card["epochs"] is None
    assert rundir.load_results(run)["best_epoch"] is None  # results.json agrees: not "1"
    assert not unread & set(card["train"]) and card["train"]["precision"] == "fp32"
    assert card["validation"]["ndcg@100"] > 0 and card["test"]["n_users"] == 40
    assert cli("info", run) == 0
    text = capsys.readouterr().out
    assert "closed form (no epochs)" in text and "epoch " not in text and "anneal" not in text
    for key in CHOICE.get(name, ()):
        assert f"{key}={card['settings'][key]!r}" in text


def test_a_gradient_run_card_keeps_its_epochs(runs, capsys):
    run = runs[1]["multvae"]
    assert cli("info", run, "--json") == 0
    card = json.loads(capsys.readouterr().out)
    assert not card["closed_form"] and card["epochs"] == 2 and card["best_epoch"] in (1, 2)
    assert card["train"]["epochs"] == 2 and "anneal_cap" in card["train"]


def test_served_card_shows_the_choice(runs):
    run = runs[1]["edlae"]
    (record,) = rundir.read_metrics(run)
    with running(ServeSettings(run=str(run))) as (base, _), client(base) as c:
        card = c.get("/v1/model").json()
    assert card["model"]["best_epoch"] is None
    for key in CHOICE["edlae"]:
        assert card["settings"][key] == record[key]
    assert "epochs" not in card["train"] and "anneal_cap" not in card["train"]


def test_a_run_written_before_still_loads_and_shows_its_card(runs, tmp_path, capsys):
    """A run whose config.json has the unset search values and every training setting (as
    runs were written before) loads, scores and gets the filtered card."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(runs[1]["edlae"], old)
    cfg = json.loads((old / rundir.CONFIG).read_text())
    cfg["model"]["config"].update(l2=None, dropout=None, popularity_grid=[0.0, 0.25])
    cfg["train"] = {**vaecf.TrainConfig().to_dict(), "device": "cpu", "precision": "fp32"}
    (old / rundir.CONFIG).write_text(json.dumps(cfg))
    rec = vaecf.Recommender.load(old)
    assert len(rec.recommend([rec.items.ids[0]], k=5).item_ids) == 5
    assert cli("info", old, "--json") == 0
    card = json.loads(capsys.readouterr().out)
    assert "epochs" not in card["train"] and card["best_epoch"] is None


# -- vaecf plot ---------------------------------------------------------------------------------
def _image(path):
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img[..., :3].std() > 0.05  # not blank
    return img


def test_plot_of_closed_form_runs_draws_their_search(runs, tmp_path, capsys):
    """One panel a run (the grid is every point on 60 items: one stage), not the 2 x 4 training
    panels (1870 px wide) left empty."""
    r = runs[1]
    assert cli("plot", r["edlae"], "--out", tmp_path / "one.png") == 0
    assert _image(tmp_path / "one.png").shape[1] < 1000
    assert cli("plot", r["edlae"], r["infae"], r["popular"], "--out", tmp_path / "three.png") == 0
    img = _image(tmp_path / "three.png")
    assert img.shape[0] > img.shape[1]  # two rows of one panel: popularity searched nothing


def test_plot_of_a_run_with_nothing_to_draw_says_so(runs, tmp_path, capsys):
    assert cli("plot", runs[1]["popular"], "--out", tmp_path / "p.png") == 2
    err = capsys.readouterr().err
    assert "no training curve" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.png").exists()


def test_plot_of_a_gradient_and_a_closed_form_run(runs, tmp_path):
    r = runs[1]
    assert cli("plot", r["multvae"], r["popular"], "--out", tmp_path / "two.png") == 0
    assert _image(tmp_path / "two.png").shape[1] > 1500  # the training curves' 2 x 4 panels


def test_the_hybrids_card_shows_the_linear_path_it_chose(planted, tmp_path):
    ds = planted("closed", 300, 60, 4, 8, seed=1, heldout=40)
    cfg = models.config_from_dict("recvae-edlae", {"hidden_dim": 16, "latent_dim": 8})
    vaecf.train(ds, cpu_config(epochs=1, batch_size=50), tmp_path / "h", cfg)
    chosen = rundir.load_config(tmp_path / "h")["model"]["config"]
    assert chosen["linear_l2"] is not None and chosen["linear_dropout"] is not None
    again = vaecf.train(ds, cpu_config(epochs=2, batch_size=50), tmp_path / "h", resume=True)
    assert again.best_epoch >= 1  # the recorded choice resumes as the run's own settings
