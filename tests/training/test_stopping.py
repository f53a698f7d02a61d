"""Training stops when it is done (--patience) and when its time is up (--budget)."""

import json
import time

import pytest

import vaecf
from tests.helpers import cpu_config
from vaecf import models, rundir
from vaecf.errors import ConfigError


@pytest.fixture(scope="module")
def ds(planted):
    return planted("stopping", 400, 80, 4, 10, 5, 40)


def _rows(out):
    return [json.loads(line) for line in (out / rundir.METRICS).read_text().splitlines()]


def test_patience_run_is_the_full_runs_prefix_and_keeps_its_best(ds, tmp_path):
    full = vaecf.train(ds, cpu_config(epochs=30, patience=0, lr=3e-3), tmp_path / "full")
    short = vaecf.train(ds, cpu_config(epochs=30, patience=2, lr=3e-3), tmp_path / "short")
    res = rundir.load_results(tmp_path / "short")
    assert res["stopped"] == "patience" and rundir.load_results(tmp_path / "full")["stopped"] == (
        "epochs"
    )
    n = res["epochs"]
    assert n < 30 and n - short.best_epoch == 2
    a, b = _rows(tmp_path / "full")[:n], _rows(tmp_path / "short")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # the same training, cut short
    vals = [r["validation"]["ndcg@100"] for r in a]
    assert short.best_epoch == 1 + max(range(n), key=lambda i: (vals[i], -i))
    assert full.best_epoch >= short.best_epoch
    if full.best_epoch == short.best_epoch:
        assert short.test_metrics == full.test_metrics


def test_a_stopped_run_resumes_to_itself_and_patience_0_extends_it(ds, tmp_path):
    out = tmp_path / "run"
    first = vaecf.train(ds, cpu_config(epochs=30, patience=1, lr=3e-3), out)
    n = rundir.load_results(out)["epochs"]
    again = vaecf.train(ds, cpu_config(epochs=30, patience=1, lr=3e-3), out, resume=True)
    assert rundir.load_results(out)["epochs"] == n and again.test_metrics == first.test_metrics
    vaecf.train(ds, cpu_config(epochs=30, patience=0, lr=3e-3), out, resume=True)
    res = rundir.load_results(out)
    assert res["epochs"] == 30 and res["stopped"] == "epochs"


def test_budget_stops_training_before_an_epoch_that_would_pass_it(ds, tmp_path):
    out = tmp_path / "run"
    t0 = time.perf_counter()
    result = vaecf.train(ds, cpu_config(epochs=100_000, patience=0, budget=6.0), out)
    wall = time.perf_counter() - t0
    res = rundir.load_results(out)
    rows = _rows(out)
    assert res["stopped"] == "budget" and res["epochs"] < 100_000
    assert "validation" in rows[-1]  # the last epoch is validated, the best kept among them
    assert result.best_epoch == 1 + max(
        (i for i, r in enumerate(rows) if "validation" in r),
        key=lambda i: (rows[i]["validation"]["ndcg@100"], -i),
    )
    slowest = max(r["train_seconds"] for r in rows)
    assert res["timing"]["total_s"] <= 6.0 + 2 * slowest + 0.5, (res["timing"], slowest)
    assert wall < 30


def test_auto_shares_its_budget_and_records_the_stop(ds, tmp_path):
    auto = models.AutoConfig(["ease", "multvae"], blend=False, linear_cv=False)
    cfg = cpu_config(epochs=100_000, patience=0, budget=6.0)
    t0 = time.perf_counter()
    vaecf.train(ds, cfg, tmp_path / "a", auto)
    wall = time.perf_counter() - t0
    rec = {c["model"]: c for c in rundir.load_results(tmp_path / "a")["auto"]["candidates"]}
    assert rec["multvae"]["stopped"] == "budget", rec
    assert rec["multvae"]["best_epoch"] <= rec["multvae"]["epochs"] < 100_000
    assert wall < 6.0 * 1.1 + 3, wall  # the selection's own reads and the test on top


def test_patience_is_a_gradient_setting_and_the_paper_preset_trains_every_epoch(ds, tmp_path):
    with pytest.raises(ConfigError, match="patience="):
        vaecf.train(ds, cpu_config(patience=5), tmp_path / "e", model="ease")
    with pytest.raises(ConfigError, match="patience="):
        vaecf.TrainConfig(patience=-1).validate()
    vaecf.train(ds, cpu_config(epochs=1, preset="paper"), tmp_path / "p")
    assert rundir.load_config(tmp_path / "p")["train"]["patience"] == 0
    vaecf.train(ds, cpu_config(epochs=1), tmp_path / "d")
    assert rundir.load_config(tmp_path / "d")["train"]["patience"] == vaecf.config.train.PATIENCE


def test_an_auto_winner_keeps_its_own_epochs_on_its_card(ds, tmp_path):
    auto = models.AutoConfig(["multvae"], blend=False, linear_cv=False)
    vaecf.train(ds, cpu_config(epochs=6, patience=0), tmp_path / "a", auto)
    res = rundir.load_results(tmp_path / "a")
    own = rundir.load_results(tmp_path / "a" / "candidates" / "multvae")
    assert res["epochs"] == 6 and res["best_epoch"] == own["best_epoch"]
    assert res["stopped"] == "epochs"


def test_a_linear_search_under_a_budget_keeps_its_best_point_so_far(ds, tmp_path):
    full = vaecf.train(ds, cpu_config(), tmp_path / "full", model="edlae")
    tried = json.loads((tmp_path / "full" / rundir.METRICS).read_text())["grid"]
    cut = vaecf.train(ds, cpu_config(budget=1e-3), tmp_path / "cut", model="edlae")
    row = json.loads((tmp_path / "cut" / rundir.METRICS).read_text())
    assert rundir.load_results(tmp_path / "cut")["stopped"] == "budget" == row["stopped"]
    assert 1 <= len(row["grid"]) < len(tried)  # at least one point: a model to keep
    assert cut.validation_metrics["ndcg@100"] <= full.validation_metrics["ndcg@100"] + 1e-9
    assert rundir.load_config(tmp_path / "cut")["model"]["config"]["l2"] == row["l2"]


def test_a_search_under_a_deadline_climbs_from_the_grids_middle():
    """A deadline may cut a search after its first points: they start at the grids' middle
    and climb to the best point's untried neighbours (walked from lambda 1 up, a cut search
    kept its worst region: ml-latest-small's test NDCG@100 0.37 where the whole search gave
    0.43); without a deadline, the grid in order. Every point comes once either way."""
    import numpy as np
    import scipy.sparse as sp

    from vaecf.models.linear_search import Search

    gram = sp.csr_matrix(np.eye(2))
    s = Search(None, gram, None, None, [], [], (), "ndcg@100", None, None, "full", ())
    l2s, ps = [1.0, 10.0, 100.0, 1000.0, 10000.0], [0.0, 0.25, 0.5]
    assert list(s.order(l2s, ps)) == [(l2, p) for p in ps for l2 in l2s]
    s.deadline = 0.0
    assert list(s.order(l2s, ps))[:3] == [(100.0, 0.25), (100.0, 0.0), (100.0, 0.5)]

    def value(l2, p):  # one peak, at lambda 1000 and p 0.5: two steps from the middle
        return -abs(l2s.index(l2) - 3) - abs(ps.index(p) - 2) - 0.1 * ps.index(p)

    got = []
    for l2, p in s.order(l2s, ps):
        got.append((l2, p))
        s.note({"stage": "coarse", "l2": l2, "dropout": p, "value": value(l2, p)})
    assert got[0] == (100.0, 0.25)
    assert got.index((1000.0, 0.5)) <= 5  # the peak by the 6th point, of 15
    assert sorted(got) == sorted((l2, p) for p in ps for l2 in l2s)


def test_a_coarse_search_under_a_budget_settles_before_the_full_catalogue(ds, tmp_path):
    """Under a budget the coarse stage's lambda, p and beta are final: the full catalogue is
    solved once there and scored on validation alone (its folds would cost a solve each: on
    ml-latest-small, 32 s of a 60 s fit); without one, the full stage scores its two points
    on the folds too."""
    cfg = {
        "coarse_items": 40,
        "selection": "cv",
        "l2_grid": [1.0, 30.0, 1000.0],
        "dropout_grid": [0.0, 0.33],
        "popularity_grid": [0.0, 0.25],
    }
    grids = {}
    for run, budget in (("free", None), ("budget", 1e6)):
        model_cfg = models.config_from_dict("edlae", cfg)
        vaecf.train(ds, cpu_config(budget=budget), tmp_path / run, model_cfg, model="edlae")
        fit = _rows(tmp_path / run)[0]
        grids[run] = [g for g in fit["grid"] if g["stage"] == "full"], fit
        coarse = [g for g in fit["grid"] if g["stage"] == "coarse"]
        assert len(coarse) == 3 * 2 * 2 and all("cv" in g for g in coarse)  # all tried
        assert fit["selection"] == "cv" and fit["cv_users"] > 0
    full, _ = grids["free"]
    assert len({(g["l2"], g["dropout"]) for g in full}) == 2 and all("cv" in g for g in full)
    full, fit = grids["budget"]
    coarse = [g for g in fit["grid"] if g["stage"] == "coarse"]
    best = max(coarse, key=lambda g: g["value"])
    (row,) = full
    assert "cv" not in row
    chosen = (row["l2"], row["dropout"], row["popularity_exponent"])
    assert chosen == (best["l2"], best["dropout"], best["popularity_exponent"])
    assert (fit["l2"], fit["dropout"], fit["popularity_exponent"]) == chosen
