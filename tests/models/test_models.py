"""The model contract: one suite every model passes, and each model against a direct reference.

Shared: scores shape, seeded determinism, save/load round trip through the run directory, the
history excluded from recommendations, `evaluate` equal to a brute-force ranking. Then EASE
against numpy, RecVAE's composite prior and KL against float64 formulas, its alternating
schedule, and the resolution of training defaults from the data.
"""

import json
import math
import re

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import vaecf
from tests.helpers import cpu_config
from tests.test_metrics import brute_force
from vaecf import memory, models
from vaecf.data.matrix import CSR
from vaecf.errors import ConfigError
from vaecf.evaluate import evaluate_model
from vaecf.models import neighbourhood
from vaecf.models.linear import cv_folds, metrics_of
from vaecf.models.multvae import auto_batch_size, scaled_anneal_steps
from vaecf.models.neighbourhood import (
    neighbour_weights,
    neighbours_of,
    popular_tier,
    rank_weights,
)
from vaecf.training.single import resolve_config

# every model fitted on its own (auto and blend are selections of these:
# tests/training/test_auto.py)
NAMES = [n for n, m in models.MODELS.items() if m.family != "selection"]


def free_bytes(n: int):
    """In place of memory.free_memory: `n` bytes free on any device."""
    return lambda device: memory.Free(n, "MemAvailable")


@pytest.fixture(scope="module")
def ds(planted):
    return planted("models", 700, 150, 5, 18, seed=4, heldout=80)


def cfg_for(name: str, **kw) -> vaecf.TrainConfig:
    base = dict(seed=5) if models.get(name).closed_form else dict(seed=5, epochs=3, batch_size=100)
    return cpu_config(**{**base, **kw})


def model_cfg(name: str):
    small = {"multvae": {"hidden_dims": [32], "latent_dim": 8}, "multdae": {"latent_dim": 8}}
    small["recvae"] = {"hidden_dim": 32, "latent_dim": 8, "n_layers": 3}
    small["recvae-edlae"] = {**small["recvae"], "linear_l2": 30.0, "linear_dropout": 0.2}
    small["ease"] = {"l2_grid": [1.0, 30.0, 1000.0]}
    small["edlae"] = {"l2_grid": [1.0, 30.0, 1000.0], "dropout_grid": [0.0, 0.33]}
    return models.config_from_dict(name, small.get(name))


@pytest.fixture(scope="module")
def runs(ds, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {n: vaecf.train(ds, cfg_for(n), root / n, model_cfg(n), model=n).run_dir for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_scores_shape_and_history_excluded(name, runs, ds):
    rec = vaecf.Recommender.load(runs[name])
    fold_in = ds.split("test_tr")
    batch = CSR.from_scipy(fold_in).batch(torch.arange(7))
    scores = rec.model.scores(batch)
    assert scores.shape == (7, ds.n_items) and torch.isfinite(scores).all()
    for row in range(5):
        history = rec.items.id_of(fold_in[row].indices)
        r = rec.recommend(history, k=30)
        assert len(r.item_ids) == 30 and not set(r.item_ids) & set(history)
        assert r.scores == sorted(r.scores, reverse=True)
        kept = rec.recommend(history, k=ds.n_items, exclude_history=False)
        assert set(history) <= set(kept.item_ids)


@pytest.mark.parametrize("name", NAMES)
def test_evaluate_equals_brute_force_ranking(name, runs, ds):
    rec = vaecf.Recommender.load(runs[name])
    fold_in, target = ds.split("test_tr"), ds.split("test_te")
    m = evaluate_model(rec.model, CSR.from_scipy(fold_in), CSR.from_scipy(target), batch_size=13)
    batch = CSR.from_scipy(fold_in).batch(torch.arange(fold_in.shape[0]))
    with torch.no_grad():
        scores = rec.model.scores(batch).double().numpy()
    _, ndcg, n = brute_force(scores, fold_in.toarray(), target.toarray(), 100)
    recall, _, _ = brute_force(scores, fold_in.toarray(), target.toarray(), 20)
    assert m["n_users"] == n
    tol = 2e-3 if models.get(name).family == "baseline" else 1e-6  # tied counts rank either way
    assert m["ndcg@100"] == pytest.approx(ndcg, abs=tol)
    assert m["recall@20"] == pytest.approx(recall, abs=tol)
    results = json.loads((runs[name] / "results.json").read_text())
    assert results["test"]["ndcg@100"] == pytest.approx(m["ndcg@100"], abs=1e-9)
    assert results["model"] == name


@pytest.mark.parametrize("name", NAMES)
def test_seeded_runs_are_identical_and_round_trip(name, runs, ds, tmp_path):
    again = vaecf.train(ds, cfg_for(name), tmp_path / "again", model_cfg(name), model=name)
    a, b = (vaecf.Recommender.load(d).model.state_dict() for d in (runs[name], again.run_dir))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    saved = json.loads((runs[name] / "config.json").read_text())
    assert saved["model"]["name"] == name
    # the loaded model scores exactly as the one that was trained (round trip)
    assert again.test_metrics == json.loads((runs[name] / "results.json").read_text())["test"]


def test_ease_and_recvae_beat_popularity(runs, ds, tmp_path):
    def ndcg(run_dir):
        return json.loads((run_dir / "results.json").read_text())["test"]["ndcg@100"]

    rec = vaecf.train(ds, cfg_for("recvae", epochs=4, lr=3e-3), tmp_path / "r", model="recvae")
    assert ndcg(runs["ease"]) > 1.2 * ndcg(runs["popular"])
    assert ndcg(rec.run_dir) > 1.2 * ndcg(runs["popular"])


# -- EASE -------------------------------------------------------------------------------------
def test_ease_matches_numpy():
    rng = np.random.default_rng(0)
    x = (rng.random((60, 25)) < 0.2).astype(np.float64)
    lam = 7.0
    p = np.linalg.inv(x.T @ x + lam * np.eye(25))
    b = np.eye(25) - p / np.diag(p)  # P diagMat(1/diag(P)): column j divided by P_jj
    assert np.allclose(np.diag(b), 0)
    model = models.build("ease", 25, {"l2": lam, "solve_dtype": "float64"})
    model.fit(sp.csr_matrix(x))
    assert np.allclose(model.weight.numpy(), b, atol=1e-5)
    batch = CSR.from_scipy(sp.csr_matrix(x[:9])).batch(torch.arange(9))
    assert np.allclose(model.scores(batch).numpy(), x[:9] @ b, atol=1e-4)


def test_ease_grid_is_recorded_and_best_chosen(runs, ds):
    row = json.loads((runs["ease"] / "metrics.jsonl").read_text().splitlines()[0])
    grid = row["grid"]
    assert [g["l2"] for g in grid] == [1.0, 30.0, 1000.0]
    c = ds.manifest["counts"]  # the Gram holds the held-out users' fold-in rows too
    assert row["gram_rows"] == c["n_train_users"] + c["n_validation_users"] + c["n_test_users"]
    best = max(grid, key=lambda g: g["validation"]["ndcg@100"])
    assert row["l2"] == best["l2"]
    results = json.loads((runs["ease"] / "results.json").read_text())
    assert results["validation"]["ndcg@100"] == pytest.approx(best["validation"]["ndcg@100"])


def _edlae_numpy(x: np.ndarray, lam: float, p: float, beta: float = 0.0) -> np.ndarray:
    """EDLAE's full-rank closed form in float64, as Steck (NeurIPS 2020) writes it; with
    beta, column j then divided by item j's count (at least 1) to the power beta."""
    g = x.T @ x
    big_lambda = lam * np.eye(len(g)) + p / (1 - p) * np.diag(np.diag(g))
    pm = np.linalg.inv(g + big_lambda)
    b = np.eye(len(g)) - pm @ np.diag(1 / np.diag(pm))
    return b / np.maximum(np.diag(g), 1.0)[None, :] ** beta


@pytest.mark.parametrize("dtype,tol", [("float64", 5e-8), ("float32", 2e-4)])  # B kept in fp32
def test_edlae_matches_numpy_and_p0_is_ease(dtype, tol):
    rng = np.random.default_rng(1)
    x = (rng.random((80, 30)) < 0.25).astype(np.float64)
    beta = models.build("edlae", 30).config.popularity_exponent  # the default penalty
    for p, b in ((0.25, 0.0), (0.5, 0.0), (0.25, beta), (0.5, 0.7)):
        cfg = {"l2": 5.0, "dropout": p, "solve_dtype": dtype, "popularity_exponent": b}
        model = models.build("edlae", 30, cfg)
        record = model.fit(sp.csr_matrix(x))
        assert record["dropout"] == p and float(model.dropout) == p
        assert record["popularity_exponent"] == b
        assert np.abs(model.weight.double().numpy() - _edlae_numpy(x, 5.0, p, b)).max() < tol
    # p > 0 shrinks the weights against EASE's (the emphasized ridge is larger)
    assert np.abs(_edlae_numpy(x, 5.0, 0.5)).sum() < np.abs(_edlae_numpy(x, 5.0, 0.0)).sum()
    e0 = models.build(
        "edlae",
        30,
        {"l2": 5.0, "dropout": 0.0, "solve_dtype": dtype, "popularity_exponent": 0.0},
    )
    ease = models.build("ease", 30, {"l2": 5.0, "solve_dtype": dtype})
    e0.fit(sp.csr_matrix(x))
    ease.fit(sp.csr_matrix(x))
    assert torch.equal(e0.weight, ease.weight)


def test_dlae_matches_numpy():
    """emphasis "none": DLAE's B = (G + Lambda)^-1 G = I - P Lambda, off the diagonal."""
    rng = np.random.default_rng(2)
    x = (rng.random((90, 25)) < 0.3).astype(np.float64)
    g = x.T @ x
    for p in (0.0, 0.4):
        big_lambda = 6.0 * np.eye(25) + p / (1 - p) * np.diag(np.diag(g))
        want = np.linalg.solve(g + big_lambda, g)
        np.fill_diagonal(want, 0.0)
        cfg = {"l2": 6.0, "dropout": p, "emphasis": "none", "solve_dtype": "float64"}
        model = models.build("edlae", 25, {**cfg, "popularity_exponent": 0.0})
        model.fit(sp.csr_matrix(x))
        assert np.abs(model.weight.numpy() - want).max() < 5e-8
        assert np.abs(model.weight.numpy() - _edlae_numpy(x, 6.0, p)).max() > 1e-3  # not EDLAE


@pytest.mark.parametrize("use", [True, False])
def test_fold_in_rows_join_the_gram_only_when_asked(use):
    rng = np.random.default_rng(3)
    x = (rng.random((70, 20)) < 0.25).astype(np.float64)
    extra = (rng.random((15, 20)) < 0.25).astype(np.float64)
    model = models.build("edlae", 20, {"l2": 4.0, "dropout": 0.3, "fold_in_rows": use})
    model.config.solve_dtype = "float64"
    record = model.fit(sp.csr_matrix(x), fold_in=sp.csr_matrix(extra))
    beta = model.config.popularity_exponent  # counted in the same Gram
    want = _edlae_numpy(np.vstack([x, extra]) if use else x, 4.0, 0.3, beta)
    assert np.abs(model.weight.double().numpy() - want).max() < 5e-8
    assert record["gram_rows"] == (85 if use else 70)


def test_edlae_search_holds_ease_and_records_every_pair(ds, tmp_path):
    """Both on the same full grid: p = 0 is on EDLAE's, so without the popularity penalty
    (which EASE does not have) it validates at least as well."""
    grid = {"l2_grid": [3.0, 30.0, 300.0], "search": "grid"}
    ease_cfg = models.config_from_dict("ease", grid)
    ease = vaecf.train(ds, cfg_for("ease"), tmp_path / "e", ease_cfg, model="ease")
    grid = {**grid, "dropout_grid": [0.0, 0.2, 0.5], "popularity_exponent": 0.0}
    edlae_cfg = models.config_from_dict("edlae", grid)
    edlae = vaecf.train(ds, cfg_for("edlae"), tmp_path / "d", edlae_cfg, model="edlae")
    assert edlae.validation_metrics["ndcg@100"] >= ease.validation_metrics["ndcg@100"] - 1e-9
    row = json.loads((edlae.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    pairs = {(g["l2"], g["dropout"]) for g in row["grid"]}
    assert pairs == {(lam, p) for lam in (3.0, 30.0, 300.0) for p in (0.0, 0.2, 0.5)}
    best = max(row["grid"], key=lambda g: g["validation"]["ndcg@100"])
    assert (row["l2"], row["dropout"]) == (best["l2"], best["dropout"])


@pytest.mark.parametrize(
    "selection,betas", [("validation", []), ("cv", []), ("validation", [0.0, 0.25, 0.5])]
)
def test_fast_search_refines_the_coarse_best_on_every_item(ds, tmp_path, selection, betas):
    """The coarse best and half a step toward its better neighbour, each neighbour judged at its
    best beta where beta is searched too (the full stage chooses beta again)."""
    cfg = {"l2_grid": [1.0, 10.0, 100.0, 1000.0], "dropout_grid": [0.0, 0.33], "coarse_items": 60}
    cfg |= {"selection": selection, "cv_folds": 2, "popularity_grid": betas}
    run = vaecf.train(
        ds, cfg_for("edlae"), tmp_path / "f", models.config_from_dict("edlae", cfg), model="edlae"
    )
    row = json.loads((run.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    coarse = [g for g in row["grid"] if g["stage"] == "coarse"]
    full = [g for g in row["grid"] if g["stage"] == "full"]
    assert len(coarse) == 8 * max(1, len(betas)) and {g["n_items"] for g in coarse} == {60}
    assert row["selection"] == selection and all(("cv" in g) == (selection == "cv") for g in full)
    own = selection == "cv" or betas
    pick = (lambda g: g["value"]) if own else (lambda g: g["validation"]["ndcg@100"])
    value: dict = {}
    for g in coarse:  # each (lambda, p) at its best beta
        value[g["l2"], g["dropout"]] = max(value.get((g["l2"], g["dropout"]), -1.0), pick(g))
    l2, p = max(value, key=value.get)
    lower, upper = value.get((l2 / 10, p), 2.0), value.get((l2 * 10, p), 2.0)  # edge: outward
    step = 10**0.25
    tried = list(dict.fromkeys((g["l2"], g["dropout"]) for g in full))
    assert tried == [(l2, p), (pytest.approx(l2 / step if lower >= upper else l2 * step), p)]
    assert {g["n_items"] for g in full} == {ds.n_items}
    best = max(full, key=pick)
    assert row["l2"] == best["l2"]
    assert run.validation_metrics["ndcg@100"] == pytest.approx(best["validation"]["ndcg@100"])


def test_cv_folds_hold_out_training_users_as_heldout_users_are(ds):
    train = ds.split("train").astype(np.float64)
    x = train.toarray()
    folds = cv_folds(train, 3, np.float64)
    seen = []
    for delta, f_in, f_te in folds:
        fin, fte = f_in.toarray(), f_te.toarray()
        assert not (fin * fte).any()  # fold-in and target disjoint
        sizes = (fin + fte).sum(1)
        assert (fte.sum(1) == np.floor(0.2 * sizes)).all() and (sizes >= 5).all()
        # each fold row is one training user's whole history
        match = [np.flatnonzero((x == r).all(axis=1)) for r in fin + fte]
        assert all(len(m) == 1 for m in match)
        mine = [int(m[0]) for m in match]
        seen += mine
        rest = np.delete(x, mine, axis=0)
        want = rest.T @ rest + fin.T @ fin  # the fold's users held out but for their fold-in
        assert np.allclose(x.T @ x + delta.toarray(), want)
    assert sorted(seen) == sorted(np.flatnonzero(x.sum(1) >= 5).tolist())  # each user once


def test_cv_selection_with_few_or_no_foldable_users():
    """Fewer training users with 5+ items than folds: one fold per user; none: the choice
    falls back to the validation users alone (recorded so), never to NaN."""
    rng = np.random.default_rng(0)
    val = tuple(sp.csr_matrix((rng.random((6, 20)) < p).astype(np.float32)) for p in (0.3, 0.2))
    vc = tuple(CSR.from_scipy(m) for m in val)
    cfg = {"selection": "cv", "cv_folds": 5, "l2_grid": [1.0, 10.0], "dropout_grid": [0.0]}
    for density, folds in ((0.15, 2), (0.05, 0)):
        x = sp.csr_matrix((rng.random((30, 20)) < density).astype(np.float32))
        assert (np.diff(x.indptr) >= 5).sum() == folds  # this draw's users with 5+ items
        rec = models.build("edlae", 20, cfg).fit(
            x, validate=lambda m: metrics_of(m.weight, *vc), validation=val
        )
        assert rec["selection"] == ("cv" if folds else "validation")
        assert rec.get("cv_folds", 0) == folds
        assert all(math.isfinite(g["value"]) for g in rec["grid"])


@pytest.mark.parametrize("repeats", [1, 2])
def test_cv_selection_pools_folds_and_validation_against_numpy(ds, repeats):
    """--selection cv: each tried (lambda, p, beta) is scored on the validation users and on
    the training folds' users, each fold's B solved without its users' targets (a float64
    numpy reference with brute-force NDCG@100); the choice is the best pooled figure. With
    cv_repeats, the folds of each repeat's draw (seeds 0, 1000, ...) are pooled too."""
    train = ds.split("train").astype(np.float64)
    val = (ds.split("validation_tr"), ds.split("validation_te"))
    cfg = {
        "l2_grid": [3.0, 300.0],
        "dropout_grid": [0.0, 0.33],
        "popularity_grid": [0.0, 0.5],
        "selection": "cv",
        "cv_folds": 3,
        "cv_repeats": repeats,
        "search": "grid",
        "solve_dtype": "float64",
    }
    model = models.build("edlae", ds.n_items, cfg)
    vc = tuple(CSR.from_scipy(m) for m in val)
    rec = model.fit(train, validate=lambda m: metrics_of(m.weight, *vc), validation=val)
    assert rec["selection"] == "cv" and rec["cv_folds"] == 3 * repeats
    x = train.toarray()
    g = x.T @ x

    def b_of(gram, lam, p, beta):
        pm = np.linalg.inv(gram + lam * np.eye(len(gram)) + p / (1 - p) * np.diag(np.diag(gram)))
        b = np.eye(len(gram)) - pm / np.diag(pm)[None, :]
        return b / np.maximum(np.diag(gram), 1.0)[None, :] ** beta

    folds = [f for r in range(repeats) for f in cv_folds(train, 3, np.float64, 1000 * r)]
    if repeats == 2:  # another draw: other users together, other 80/20 splits
        assert not all((a[1] != b[1]).nnz == 0 for a, b in zip(folds[:3], folds[3:]))
    grid = rec["grid"]
    assert len(grid) == 8
    for row in grid:
        point = (row["l2"], row["dropout"], row["popularity_exponent"])
        sums, n = 0.0, 0
        for delta, f_in, f_te in folds:
            scores = f_in.toarray() @ b_of(g + delta.toarray(), *point)
            _, ndcg, users = brute_force(scores, f_in.toarray(), f_te.toarray(), 100)
            sums, n = sums + ndcg * users, n + users
        assert row["cv"]["n_users"] == n
        assert row["cv"]["ndcg@100"] == pytest.approx(sums / n, abs=1e-6)
        v = row["validation"]
        pooled = (sums + v["ndcg@100"] * v["n_users"]) / (n + v["n_users"])
        assert row["value"] == pytest.approx(pooled, abs=1e-6)
    best = max(grid, key=lambda r: r["value"])
    chosen = (rec["l2"], rec["dropout"], rec["popularity_exponent"])
    assert chosen == (best["l2"], best["dropout"], best["popularity_exponent"])
    want = b_of(g, *chosen)
    np.fill_diagonal(want, 0.0)
    assert np.abs(model.weight.double().numpy() - want).max() < 1e-5
    # beta is searched without cv too (validation alone), and the grid records every beta
    cfg.pop("selection")
    rec = models.build("edlae", ds.n_items, cfg).fit(
        train, validate=lambda m: metrics_of(m.weight, *vc), validation=val
    )
    assert rec["selection"] == "validation" and "cv" not in rec["grid"][0]
    assert {r["popularity_exponent"] for r in rec["grid"]} == {0.0, 0.5}
    best = max(rec["grid"], key=lambda r: r["validation"]["ndcg@100"])
    assert rec["popularity_exponent"] == best["popularity_exponent"]


def test_hybrid_starts_where_edlae_ends(ds):
    """Before its first epoch the hybrid's scores are alpha x B with EDLAE's B: the same
    ranking as EDLAE itself."""
    hybrid = models.build("recvae-edlae", ds.n_items, model_cfg("recvae-edlae"))
    val = (ds.split("validation_tr"), ds.split("validation_te"))
    record = hybrid.prepare(ds.split("train"), val)
    assert (record["linear_l2"], record["linear_dropout"]) == (30.0, 0.2)
    # its path is EDLAE without the popularity penalty (a score scale the training learns)
    plain = {"l2": 30.0, "dropout": 0.2, "popularity_exponent": 0.0}
    edlae = models.build("edlae", ds.n_items, plain)
    edlae.fit(ds.split("train"))
    assert torch.equal(hybrid.shallow, edlae.weight)
    batch = CSR.from_scipy(ds.split("test_tr")).batch(torch.arange(20))
    with torch.no_grad():
        got, want = hybrid.eval().scores(batch), edlae.scores(batch)
    torch.testing.assert_close(got, record["alpha"] * want, rtol=1e-5, atol=1e-5)


def test_trained_linear_path_moves_and_never_uses_its_diagonal(ds, tmp_path):
    """--train-linear: B is trained with the decoder; its diagonal (which the gradient does
    reach) never enters a score, sparse or dense."""
    cfg = models.config_from_dict("recvae-edlae", {**vars(model_cfg("recvae-edlae"))})
    cfg.train_linear = True
    run = vaecf.train(ds, cfg_for("recvae-edlae", epochs=2), tmp_path / "t", cfg)
    model = vaecf.Recommender.load(run.run_dir).model
    plain = {"l2": 30.0, "dropout": 0.2, "popularity_exponent": 0.0}
    edlae = models.build("edlae", ds.n_items, plain)
    edlae.fit(ds.split("train"))
    off = ~torch.eye(ds.n_items, dtype=torch.bool)
    assert (model.shallow[off] - edlae.weight[off]).abs().max() > 1e-4  # trained
    x = CSR.from_scipy(ds.split("test_tr"))
    batch = x.batch(torch.arange(30))
    dense = torch.from_numpy(ds.split("test_tr")[:30].toarray()).float()
    with torch.no_grad():
        before = model.scores(batch)
        torch.testing.assert_close(model.dense_scores(dense), before, rtol=1e-4, atol=1e-4)
        model.shallow.diagonal().add_(5.0)
        torch.testing.assert_close(model.scores(batch), before, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.dense_scores(dense), before, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("in_cache", [512, 4])  # the systems solved compiled, or by halves
def test_sparse_solver_with_every_item_as_neighbour_is_the_dense_solution(p, in_cache, monkeypatch):
    """Where every pair of items co-occurs, the neighbourhood regression over all other items
    is EASE's (EDLAE's) column exactly."""
    monkeypatch.setattr(neighbourhood, "IN_CACHE", in_cache)
    rng = np.random.default_rng(5)
    x = (rng.random((120, 70)) < 0.5).astype(np.float64)  # systems of 69: past FACTOR_BASE
    assert ((x.T @ x) > 0).all()
    cfg = {"l2": 7.0, "dropout": p, "solver": "sparse", "neighbours": 69}
    model = models.build("edlae", 70, {**cfg, "solve_dtype": "float64"})
    record = model.fit(sp.csr_matrix(x))
    assert record["solver"] == "sparse" and model.sparse and model.weight.numel() == 0
    b = model.item_vectors().to_dense().double().numpy()
    want = _edlae_numpy(x, 7.0, p, model.config.popularity_exponent)
    assert np.abs(b - want).max() < 1e-5  # B's values kept in float32


def test_sparse_solver_scores_rank_and_round_trip(ds, tmp_path):
    """Fewer neighbours than items: B has at most n_items x k non-zeros, its zero diagonal
    kept; scores, dense scores, similar items and a saved run agree with the dense product of
    the same B; and its accuracy is close to the dense solver's."""
    k = 20
    base = {"l2_grid": [10.0, 100.0], "dropout_grid": [0.0, 0.3]}
    runs = {
        s: vaecf.train(
            ds,
            cfg_for("edlae"),
            tmp_path / s,
            models.config_from_dict("edlae", {**base, "solver": s, "neighbours": k}),
            model="edlae",
        )
        for s in ("sparse", "dense")
    }
    rec = vaecf.Recommender.load(runs["sparse"].run_dir)
    model = rec.model
    b = model.item_vectors().to_dense()
    cfg = model.config
    counts = b.count_nonzero(dim=0).numpy()
    wide = counts > k  # the popular tier's columns: up to popular_neighbours
    assert wide.sum() <= int(cfg.popular_share * ds.n_items)
    assert (counts <= min(cfg.popular_neighbours, ds.n_items - 1)).all()
    assert model.sparse and model.b_values.numel() <= ds.n_items * k + counts[wide].sum()
    assert not b.diagonal().any()
    fold_in = ds.split("test_tr")
    batch = CSR.from_scipy(fold_in).batch(torch.arange(25))
    dense_x = torch.from_numpy(fold_in[:25].toarray()).float()
    with torch.no_grad():
        torch.testing.assert_close(model.scores(batch), dense_x @ b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.dense_scores(dense_x), dense_x @ b, rtol=1e-5, atol=1e-6)
    from vaecf.models.base import cosine_neighbours

    got = rec.similar_items(rec.items.id_of([3])[0], k=5)
    want = cosine_neighbours(b, 3, 5)
    assert rec.items.index_of(got.item_ids)[0] == want[0]
    results = json.loads((runs["sparse"].run_dir / "results.json").read_text())
    row = json.loads((runs["sparse"].run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert row["solver"] == "sparse" and row["neighbours"] == k
    dense = runs["dense"].test_metrics["ndcg@100"]
    assert abs(results["test"]["ndcg@100"] - dense) < 0.03


def test_sparse_solver_cv_selection_equals_the_dense_one_where_every_pair_co_occurs():
    """--selection cv with the sparse solver: each tried (lambda, p, beta) is scored on the
    validation users and on every fold, each fold's B solved by the sparse solver on the
    Gram with the fold's rows swapped. Where every pair of items co-occurs (in every fold's
    Gram too) and every other item is a neighbour, that is the dense solver's selection:
    the same figures at every point, the same choice and the same B."""
    rng = np.random.default_rng(7)
    n = 25
    x = sp.csr_matrix((rng.random((150, n)) < 0.5).astype(np.float32))
    val = tuple(sp.csr_matrix((rng.random((30, n)) < p).astype(np.float32)) for p in (0.4, 0.15))
    vc = tuple(CSR.from_scipy(m) for m in val)
    cfg = {
        "l2_grid": [3.0, 30.0],
        "dropout_grid": [0.0, 0.3],
        "popularity_grid": [0.0, 0.5],
        "selection": "cv",
        "cv_folds": 3,
        "search": "grid",
        "solve_dtype": "float64",
        "neighbours": n - 1,
    }
    recs, bs, lines = {}, {}, []
    for solver in ("dense", "sparse"):
        model = models.build("edlae", n, {**cfg, "solver": solver})
        recs[solver] = model.fit(
            x, validate=lambda m: evaluate_model(m, *vc), validation=val, log=lines.append
        )
        bs[solver] = model.item_vectors().to_dense() if model.sparse else model.weight
    sparse, dense = recs["sparse"], recs["dense"]
    assert sparse["solver"] == "sparse" and sparse["selection"] == "cv"
    assert sparse["cv_folds"] == dense["cv_folds"] == 3
    assert any("cv: 4 sparse solves per point tried" in line for line in lines)
    assert len(sparse["grid"]) == len(dense["grid"]) == 8  # every beta scored, no extra solve
    for a, b in zip(sparse["grid"], dense["grid"]):
        assert (a["l2"], a["dropout"], a["popularity_exponent"]) == (
            b["l2"],
            b["dropout"],
            b["popularity_exponent"],
        )
        assert a["cv"]["n_users"] == b["cv"]["n_users"] > 100
        assert a["cv"]["ndcg@100"] == pytest.approx(b["cv"]["ndcg@100"], abs=1e-5)
        assert a["value"] == pytest.approx(b["value"], abs=1e-5)
    pick = ("l2", "dropout", "popularity_exponent")
    assert [sparse[k] for k in pick] == [dense[k] for k in pick]
    torch.testing.assert_close(bs["sparse"], bs["dense"], rtol=1e-4, atol=1e-6)


def test_sparse_solver_fast_search_chooses_on_folds_through_train(ds, tmp_path):
    """A run with the sparse solver, --selection cv and the fast search: the coarse stage (a
    dense sub-problem) and both full-catalogue points are scored on folds too, every beta of
    the grid is tried, the best pooled full point is kept, and the run holds its sparse B."""
    settings = {
        "l2_grid": [1.0, 30.0, 1000.0],
        "dropout_grid": [0.0, 0.33],
        "popularity_grid": [0.0, 0.25],
        "selection": "cv",
        "cv_folds": 3,
        "coarse_items": 60,
        "solver": "sparse",
        "neighbours": 20,
    }
    cfg = models.config_from_dict("edlae", settings)
    run = vaecf.train(ds, cfg_for("edlae"), tmp_path / "run", cfg, model="edlae")
    row = json.loads((run.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert row["solver"] == "sparse" and row["selection"] == "cv" and row["cv_folds"] == 3
    coarse = [g for g in row["grid"] if g["stage"] == "coarse"]
    full = [g for g in row["grid"] if g["stage"] == "full"]
    assert len(coarse) == 12 and {g["n_items"] for g in coarse} == {60}
    assert len(full) == 4 and {g["popularity_exponent"] for g in full} == {0.0, 0.25}
    assert all("cv" in g and g["cv"]["n_users"] > 100 for g in coarse + full)
    best = max(full, key=lambda g: g["value"])
    pick = ("l2", "dropout", "popularity_exponent")
    assert [row[k] for k in pick] == [best[k] for k in pick]
    model = vaecf.Recommender.load(run.run_dir).model
    wide = int(0.02 * ds.n_items) * (ds.n_items - 1 - 20)  # the popular tier's longer columns
    assert model.sparse and model.b_values.numel() <= ds.n_items * 20 + wide
    assert math.isfinite(run.test_metrics["ndcg@100"]) and run.test_metrics["ndcg@100"] > 0.2


def test_popular_items_get_wider_neighbourhoods():
    """popular_share: the most popular items' columns are those of a solve with
    popular_neighbours for every item, the others those of a solve with neighbours."""
    rng = np.random.default_rng(6)
    pop = np.linspace(0.6, 0.05, 60)  # item 0 the most popular
    x = sp.csr_matrix((rng.random((300, 60)) < pop).astype(np.float32))
    cpu = torch.device("cpu")

    def dense(parts):
        ip, ix, v = (t.numpy() for t in parts)
        return sp.csr_matrix((v, ix, ip), shape=(60, 60)).toarray()

    narrow = dense(neighbour_weights(x, 5.0, 0.2, 8, cpu))
    broad = dense(neighbour_weights(x, 5.0, 0.2, 30, cpu))
    mixed = dense(neighbour_weights(x, 5.0, 0.2, 8, cpu, popular_share=0.1, popular_k=30))
    counts = (x.T @ x).diagonal()
    top = popular_tier(counts, 0.1)
    assert len(top) == 6 and counts[top].min() > np.delete(counts, top).max()  # the 6 largest
    rest = np.setdiff1d(np.arange(60), top)
    np.testing.assert_allclose(mixed[:, top], broad[:, top], atol=1e-6)
    np.testing.assert_allclose(mixed[:, rest], narrow[:, rest], atol=1e-6)
    assert (np.count_nonzero(mixed[:, top], axis=0) > 8).all()


def test_neighbour_rank_cosine_lets_specific_rarer_items_in():
    """Item 0 co-occurs 10 times with item 1 (seen 100 times) and 4 times with item 2 (seen 4
    times, always with 0): by count 1 is its neighbour, by cosine (10/10 < 4/2) it is 2; and
    the solve's column 0 is the ridge regression on the chosen neighbour alone."""
    g = sp.csr_matrix(np.array([[20.0, 10, 4], [10, 100, 0], [4, 0, 4]]))
    by_count = neighbours_of(g, 1, weight=rank_weights("count", g.diagonal()))[0]
    by_cosine = neighbours_of(g, 1, weight=rank_weights("cosine", g.diagonal()))[0]
    assert by_count[0].tolist() == [1] and by_cosine[0].tolist() == [2]
    for rank, i in (("count", 1), ("cosine", 2)):
        ip, ix, v = neighbour_weights(None, 3.0, 0.0, 1, torch.device("cpu"), gram=g, rank=rank)
        b = sp.csr_matrix((v.numpy(), ix.numpy(), ip.numpy()), shape=(3, 3)).toarray()
        assert b[i, 0] == pytest.approx(g[i, 0] / (g[i, i] + 3.0), rel=1e-6)
        assert b[3 - i, 0] == 0.0
    with pytest.raises(ValueError, match="unknown neighbour rank"):
        rank_weights("jaccard", g.diagonal())


def test_auto_solver_goes_sparse_where_dense_does_not_fit(ds, monkeypatch):
    from vaecf.models import ease

    n, x = ds.n_items, ds.split("train")
    monkeypatch.setattr(memory, "free_memory", free_bytes(10**9))
    assert models.build("ease", n, {"l2": 30.0}).fit(x)["solver"] == "dense"
    monkeypatch.setattr(ease, "linear_bytes", lambda *a: 10**12)  # the dense arrays never fit
    record = models.build("ease", n, {"l2": 30.0, "neighbours": 10}).fit(x)
    wide = int(0.02 * n) * (n - 1 - 10)  # the popular tier's columns (1024 > n - 1 here)
    assert record["solver"] == "sparse" and record["nnz"] <= n * 10 + wide
    assert record["popular_share"] == 0.02 and record["popular_neighbours"] == 1024
    assert record["neighbour_rank"] == "cosine"
    monkeypatch.setattr(memory, "free_memory", free_bytes(10**6))
    with pytest.raises(
        vaecf.RunError, match=r"sparse solver on .* needs about .* [GM]iB \(the sparse"
    ) as e:
        models.build("ease", n, {"l2": 30.0}).fit(x)  # neither fits: refused with figures
    assert "--selection" not in str(e.value)
    # cv holds a fold's Gram (half of gram_bytes' two copies) and B too: where only they do
    # not fit, choosing on validation is advised; where nothing fits, it is not
    val = (ds.split("validation_tr"), ds.split("validation_te"))
    cv = {"l2_grid": [3.0, 30.0], "selection": "cv"}
    monkeypatch.setattr(ease, "gram_bytes", lambda x, exact=False: 10**9)
    for free, advised in ((12 * 10**8, True), (10**6, False)):
        monkeypatch.setattr(memory, "free_memory", free_bytes(free))
        with pytest.raises(vaecf.RunError, match=r"sparse solver on .* needs about") as e:
            models.build("ease", n, cv).fit(x, validate=lambda m: {}, validation=val)
        assert ("or choose with --selection validation" in str(e.value)) == advised
    with pytest.raises(ConfigError, match="not --emphasis none"):
        cfg = {"l2": 3.0, "dropout": 0.2, "emphasis": "none", "solver": "sparse"}
        models.build("edlae", n, cfg).fit(x)


def test_a_sparse_fit_the_pair_bound_would_refuse_is_counted_and_runs(monkeypatch):
    """The sum of squared history lengths counts a pair of items once per history holding it;
    where that bound does not fit, G's entries are counted before refusing."""
    from vaecf.models import ease

    rng = np.random.default_rng(8)
    x = np.zeros((200, 60), dtype=np.float32)
    x[:, :40] = 1  # every history holds the same 40 items: 200 times each pair
    x[rng.random((200, 60)) < 0.02] = 1
    x = sp.csr_matrix(x)
    bound, exact = ease.gram_bytes(x), ease.gram_bytes(x, exact=True)
    assert exact == 16 * (x.T @ x).nnz and bound > 20 * exact
    monkeypatch.setattr(ease, "linear_bytes", lambda *a: 10**12)  # the dense arrays never fit
    monkeypatch.setattr(memory, "free_memory", free_bytes(3 * 10**6))  # the bound: ~7 MB
    assert models.build("ease", 60, {"l2": 30.0}).fit(x)["solver"] == "sparse"
    monkeypatch.setattr(memory, "free_memory", free_bytes(10**6))  # a block's work: ~1.8 MB
    with pytest.raises(vaecf.RunError, match=r"sparse solver on 60 items needs about"):
        models.build("ease", 60, {"l2": 30.0}).fit(x)


def test_ease_refuses_what_does_not_fit_before_allocating_with_advice_that_helps(monkeypatch):
    from vaecf.models import linear

    n = 2000
    model = models.build("ease", n, {"l2": 10.0, "solver": "dense"})
    # item j has j // 10 users: the 500 most popular items have >= 150
    rows = [u for j in range(n) for u in range(j // 10)]
    cols = [j for j in range(n) for _ in range(j // 10)]
    x = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(200, n))
    free = linear.linear_bytes(500, torch.float32, False)  # room for 500 items' arrays
    monkeypatch.setattr(memory, "free_memory", free_bytes(free))
    with pytest.raises(vaecf.RunError) as e:
        model.fit(x)
    msg = str(e.value)
    assert f"needs about {memory.gib(linear.linear_bytes(n, torch.float32, False))} for" in msg
    assert "keep the 500 items with at least 150 users" in msg and "--min-item-users 150" in msg
    assert "float32" not in msg.split("(MemAvailable);")[1]  # already float32: no such advice
    assert model.weight.numel() == 0  # the placeholder went first; nothing large was made
    model.config.solve_dtype = "float64"
    with pytest.raises(vaecf.RunError, match=r"solve in float32"):
        model.fit(x)
    searching = models.build("ease", n, {"l2_grid": [1.0, 10.0], "solver": "dense"})
    monkeypatch.setattr(memory, "free_memory", free_bytes(free * 16 + 1))  # one solve fits
    with pytest.raises(vaecf.RunError, match=r"give --l2 \(one solve needs"):
        searching.fit(x, validate=lambda m: {})


# -- inf-AE -----------------------------------------------------------------------------------
def test_infae_kernel_is_a_wide_networks_tangent_kernel():
    """The closed form's kernel against the empirical neural tangent kernel of a real
    one-hidden-layer ReLU network 200,000 units wide (NTK parameterisation): the sum over
    parameters of the products of the output's gradients at x and y."""
    from vaecf.models.infae import ntk

    rng = np.random.default_rng(0)
    x = (rng.random((6, 12)) < 0.4).astype(np.float64) * rng.random((6, 12)) * 3
    x[0] = 0.0  # an empty history: zero kernel
    m = 200_000
    w, a = rng.standard_normal((m, 12)), rng.standard_normal(m)
    pre = x @ w.T  # (6, m)
    act, on = np.maximum(pre, 0.0), (pre > 0).astype(np.float64)
    grad_a = act / np.sqrt(m)  # d f / d a_r
    emp = grad_a @ grad_a.T + ((on * a**2) @ on.T / m) * (x @ x.T)  # + d f / d W_r terms
    norms = torch.from_numpy(np.linalg.norm(x, axis=1))
    got = ntk(torch.from_numpy(x @ x.T), norms, norms).numpy()
    assert np.all(got[0] == 0) and np.all(got[:, 0] == 0)
    np.testing.assert_allclose(got, emp, rtol=0.03, atol=0.02 * np.abs(emp).max())


def test_infae_matches_numpy_kernel_ridge_and_keeps_the_best_ridge():
    """Scores equal float64 numpy kernel ridge regression, K(x, X) (K + lambda m I)^-1 X;
    the grid is recorded and its best point kept; fold-in rows join the fitted users."""
    from vaecf.models.infae import ntk

    rng = np.random.default_rng(3)
    x = (rng.random((80, 30)) < 0.25).astype(np.float64)
    held = (rng.random((10, 30)) < 0.25).astype(np.float64)

    def k(a, b):
        na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
        t = np.arccos(np.clip(a @ b.T / np.maximum(np.outer(na, nb), 1e-12), -1, 1))
        return np.outer(na, nb) * (np.sin(t) + 2 * (np.pi - t) * np.cos(t)) / (2 * np.pi)

    fitted = np.vstack([x, held[:5]])
    fitted = fitted[fitted.sum(1) > 0]
    kk = k(fitted, fitted)
    want = k(held, fitted) @ np.linalg.solve(
        kk + 0.3 * np.diag(kk).mean() * np.eye(len(kk)), fitted
    )
    model = models.build("infae", 30, {"ridge": 0.3})
    rec = model.fit(sp.csr_matrix(x), fold_in=sp.csr_matrix(held[:5]))
    assert rec["users"] == len(fitted) and rec["ridge"] == 0.3
    batch = CSR.from_scipy(sp.csr_matrix(held)).batch(torch.arange(10))
    np.testing.assert_allclose(model.scores(batch).double().numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        model.dense_scores(torch.from_numpy(held).float()).double().numpy(), want, atol=1e-4
    )
    # under bf16 autocast (evaluation at --precision bf16) the sum over users stays float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = model.scores(batch)
    np.testing.assert_allclose(half.double().numpy(), want, rtol=1e-4, atol=1e-5)
    assert torch.allclose(ntk(torch.eye(2), torch.ones(2), torch.ones(2)).diagonal(), torch.ones(2))
    # the search: every lambda recorded, the best on validation kept (the grid in rising
    # order, then two bisections between the best so far and its better neighbour)
    searching = models.build("infae", 30, {"ridge_grid": [30.0, 0.01, 0.3]})
    # a validation that prefers 0.3 on the grid; then 3 (between 0.3 and 30) is worse, and
    # 0.9487 (between 0.3 and 3) the best
    values = iter([0.2, 0.5, 0.4, 0.45, 0.55])
    alphas = []

    def validate(m):
        alphas.append(m.alpha.clone())
        return {"ndcg@100": next(values)}

    rec = searching.fit(sp.csr_matrix(x), validate=validate)
    got = [g["ridge"] for g in rec["grid"]]
    assert got == pytest.approx([0.01, 0.3, 30.0, 3.0, 0.3**0.5 * 3.0**0.5])
    assert rec["ridge"] == got[4] and float(searching.l2) == pytest.approx(got[4])
    assert torch.equal(searching.alpha, alphas[4])
    with pytest.raises(ConfigError, match="give --ridge"):
        models.build("infae", 30, {"ridge_grid": [0.1, 1.0]}).fit(sp.csr_matrix(x))


def test_infae_search_on_the_validation_split_equals_scoring_each_fitted_model(ds):
    """Given the validation split, a tried lambda is scored from the factor alone (no alpha):
    the same metrics and choice as scoring each fitted model, and the winner's alpha."""
    from vaecf.evaluate import evaluate_scores

    val = (ds.split("validation_tr"), ds.split("validation_te"))
    vc = tuple(CSR.from_scipy(m) for m in val)
    grid = {"ridge_grid": [0.03, 0.3, 3.0, 30.0]}
    fast, slow = (models.build("infae", ds.n_items, grid) for _ in range(2))
    a = fast.fit(ds.split("train"), validate=lambda m: 1 / 0, validation=val)
    b = slow.fit(ds.split("train"), validate=lambda m: evaluate_scores(m.scores, *vc))
    assert a["ridge"] == b["ridge"]
    for x, y in zip(a["grid"], b["grid"]):
        assert x["validation"]["ndcg@100"] == pytest.approx(y["validation"]["ndcg@100"], abs=1e-4)
    torch.testing.assert_close(fast.alpha, slow.alpha)


def test_infae_search_beyond_search_users_scores_a_seeded_sample_of_them(ds, monkeypatch):
    """More validation users than SEARCH_USERS: lambda is chosen on a seeded sample of that
    many, the values those users alone give."""
    from vaecf.evaluate import evaluate_scores
    from vaecf.models import infae

    monkeypatch.setattr(infae, "SEARCH_USERS", 25)
    val = (ds.split("validation_tr"), ds.split("validation_te"))
    keep = np.sort(np.random.default_rng(0).choice(val[0].shape[0], 25, replace=False))
    part = tuple(CSR.from_scipy(m[keep]) for m in val)
    grid = {"ridge_grid": [0.03, 3.0, 300.0]}
    fast, slow = (models.build("infae", ds.n_items, grid) for _ in range(2))
    a = fast.fit(ds.split("train"), validate=lambda m: 1 / 0, validation=val)
    b = slow.fit(ds.split("train"), validate=lambda m: evaluate_scores(m.scores, *part))
    assert a["search_users"] == 25 and val[0].shape[0] > 25
    assert a["ridge"] == b["ridge"]
    for x, y in zip(a["grid"], b["grid"]):
        assert x["validation"]["n_users"] == y["validation"]["n_users"] <= 25
        assert x["validation"]["ndcg@100"] == pytest.approx(y["validation"]["ndcg@100"], abs=1e-4)


@pytest.mark.parametrize("name", ["edlae", "infae"])
def test_a_search_selects_on_any_select_metric(ds, tmp_path, name):
    """--select-metric beyond the three reported metrics: every tried point records it and
    the kept point is its best (it raised a KeyError before)."""
    run = vaecf.train(ds, cfg_for(name, select_metric="ndcg@10"), tmp_path / name, model_cfg(name))
    row = json.loads((run.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    best = max(row["grid"], key=lambda g: g["validation"]["ndcg@10"])
    key = "ridge" if name == "infae" else "l2"
    assert row[key] == best[key] and "ndcg@10" in run.validation_metrics


def _ntk64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The tangent kernel written out in numpy, float64 (the reference for the model's)."""
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    scale = np.outer(na, nb)
    t = np.arccos(np.clip(a @ b.T / scale, -1.0, 1.0))
    return scale * (np.sin(t) + 2 * (np.pi - t) * np.cos(t)) / (2 * np.pi)


def test_infae_beyond_max_users_is_nystroms_subset_of_regressors():
    """Above --max-users the seeded sample are landmarks and every user a target: alpha =
    (K_UL^T K_UL + lambda m (U / L) K_LL)^-1 K_UL^T X (m: K_LL's mean diagonal), against
    numpy (rows in 4,096-user blocks: 5,000 rows here make two). users_t is row-major: the
    sparse first layer gathers its rows."""
    rng = np.random.default_rng(8)
    x = (rng.random((5000, 30)) < 0.2).astype(np.float64)
    x = x[x.sum(1) > 0]
    model = models.build("infae", 30, {"ridge": 0.5, "max_users": 40})
    rec = model.fit(sp.csr_matrix(x.astype(np.float32)))
    assert rec["approximation"] == "nystrom" and rec["users"] == 40 and rec["rows"] == len(x)
    land = x[np.sort(np.random.default_rng(0).choice(len(x), 40, replace=False))]
    k_ul, k_ll = _ntk64(x, land), _ntk64(land, land)
    shift = 0.5 * k_ll.diagonal().mean() * len(x) / 40
    a = k_ul.T @ k_ul + shift * k_ll + 1e-7 * shift * k_ll.diagonal().mean() * np.eye(40)
    ref = np.linalg.solve(a, k_ul.T @ x)
    np.testing.assert_allclose(model.alpha.numpy(), ref, rtol=1e-3, atol=1e-4 * abs(ref).max())
    np.testing.assert_array_equal(model.users_t.numpy().T, land)
    assert model.users_t.is_contiguous()
    loaded = models.build("infae", 30, {"ridge": 0.5})
    loaded.load_state_dict({**model.state_dict(), "users_t": model.users_t.T.contiguous().T})
    assert loaded.users_t.is_contiguous()  # a run saved column-major is read row-major
    torch.testing.assert_close(loaded.users_t, model.users_t, rtol=0, atol=0)


def test_infae_nystrom_keeps_what_the_sample_throws_away(ds):
    """On planted tastes with 30 of 540 training users in the kernel: every user a target
    (Nystrom) scores the test users above fitting the 30 alone."""
    from vaecf.evaluate import evaluate_scores

    val = (ds.split("validation_tr"), ds.split("validation_te"))
    test = tuple(CSR.from_scipy(ds.split(s)) for s in ("test_tr", "test_te"))
    got = {}
    for how in ("nystrom", "sample"):
        m = models.build("infae", ds.n_items, {"max_users": 30, "beyond_max_users": how})
        m.fit(ds.split("train"), validation=val)
        got[how] = evaluate_scores(m.scores, *test)["ndcg@100"]
    assert got["nystrom"] > got["sample"] + 0.02, got


def test_infae_samples_users_and_refuses_what_does_not_fit(monkeypatch):
    from vaecf.models import infae

    rng = np.random.default_rng(4)
    x = sp.csr_matrix((rng.random((200, 40)) < 0.2).astype(np.float32))
    model = models.build("infae", 40, {"ridge": 1.0, "max_users": 50})
    rec = model.fit(x)
    assert rec["users"] == 50 and rec["rows"] == x.shape[0] and model.alpha.shape == (50, 40)
    again = models.build("infae", 40, {"ridge": 1.0, "max_users": 50})
    again.fit(x)
    assert torch.equal(again.users_t, model.users_t)  # the sample is seeded
    need = infae.fit_bytes(x.shape[0], 40, torch.float64)
    monkeypatch.setattr(memory, "free_memory", free_bytes(need // 4))
    big = models.build("infae", 40, {"ridge": 1.0})
    with pytest.raises(vaecf.RunError, match=r"give --max-users (\d+) or less") as e:
        big.fit(x)
    assert "--kernel-dtype float32" in str(e.value) and "(MemAvailable)" in str(e.value)
    assert big.alpha.numel() == 0  # refused before anything was fitted
    # the advice fits when followed (a Nystrom fit over every row through that many landmark
    # users: its rows count, not only the kernel), and asks for no fewer users than needed:
    # one user in ten more would not fit
    users = int(re.search(r"--max-users (\d+)", str(e.value)).group(1))
    assert infae.fit_bytes(users, 40, torch.float64, 200) <= need // 4
    assert infae.fit_bytes(users * 11 // 10, 40, torch.float64, 200) > need // 4
    models.build("infae", 40, {"ridge": 1.0, "max_users": users}).fit(x)


# -- RecVAE -----------------------------------------------------------------------------------
def _log_normal64(z, mu, logvar):
    return -0.5 * (logvar + math.log(2 * math.pi) + (z - mu) ** 2 / np.exp(logvar))


def test_recvae_prior_and_kl_match_float64():
    """An encoder step's KL parts (models/latent.py's composite prior) against the formulas in
    numpy float64: the mixture of N(0, 1), the old posterior and N(0, e^10), weighted per user
    by gamma x |history|."""
    torch.manual_seed(0)
    cfg = {"hidden_dim": 16, "latent_dim": 6, "n_layers": 2, "dropout": 0.0}
    m = models.build("recvae", 40, cfg).double().train()
    m.log_weights = torch.log(torch.tensor([0.15, 0.75, 0.10], dtype=torch.float64))  # exact
    with torch.no_grad():  # an old posterior that differs from the encoder
        for p in m.prior_encoder.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = sp.random(5, 40, density=0.2, format="csr", random_state=1, dtype=np.float64)
    x.data[:] = 1
    batch = CSR.from_scipy(x).batch(torch.arange(5))
    batch.values = batch.values.double()
    torch.manual_seed(4)
    _, parts = m.loss(batch, 0.0, 5, m.phases()[0])
    torch.manual_seed(4)  # the same noise: dropout 0 draws nothing before it
    mu, logvar = (t.detach() for t in m.encoder(batch, 0.0))
    z = (mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)).numpy()
    post_mu, post_logvar = (t.detach().numpy() for t in m.prior_encoder(batch, 0.0))
    w = [0.15, 0.75, 0.10]
    dens = (
        w[0] * np.exp(_log_normal64(z, 0, 0))
        + w[1] * np.exp(_log_normal64(z, post_mu, post_logvar))
        + w[2] * np.exp(_log_normal64(z, 0, 10.0))
    )
    kl = (_log_normal64(z, mu.numpy(), logvar.numpy()) - np.log(dens)).sum(1)
    assert parts["kl_sum"].item() == pytest.approx(kl.sum(), rel=1e-10)
    weight = m.config.gamma * np.asarray(x.sum(1)).ravel()
    assert parts["kl_term_sum"].item() == pytest.approx((weight * kl).sum(), rel=1e-10)


def test_recvae_phases_move_only_their_parameters(ds, tmp_path):
    torch.manual_seed(0)
    m = models.build("recvae", ds.n_items, model_cfg("recvae"))
    opts = {k: torch.optim.Adam(p, lr=1e-2) for k, p in m.param_groups().items()}
    batch = CSR.from_scipy(ds.split("train")).batch(torch.arange(50))
    m.train()
    for phase in m.phases():
        m.begin_phase(phase)
        if phase.name == "encoder":  # the prior's old posterior is the encoder, refreshed
            for a, b in zip(m.prior_encoder.parameters(), m.encoder.parameters()):
                assert torch.equal(a, b)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        loss, _ = m.loss(batch, 0.0, 50, phase)
        for o in opts.values():
            o.zero_grad()
        loss.backward()
        for g in phase.groups:
            opts[g].step()
        moved = {
            k.split(".")[0] for k, v in m.state_dict().items() if not torch.equal(v, before[k])
        }
        assert moved == {phase.name}, (phase.name, moved)
        if phase.name == "decoder":
            assert all(p.grad is None for p in m.encoder.parameters())


def test_recvae_resume_is_bit_exact(ds, tmp_path):
    mcfg = model_cfg("recvae")
    full = vaecf.train(ds, cfg_for("recvae", epochs=3), tmp_path / "full", mcfg)
    vaecf.train(ds, cfg_for("recvae", epochs=1), tmp_path / "split", mcfg)
    resumed = vaecf.train(ds, cfg_for("recvae", epochs=3), tmp_path / "split", resume=True)
    a = torch.load(tmp_path / "full/last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "split/last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.test_metrics == full.test_metrics


# -- settings ---------------------------------------------------------------------------------
def test_auto_defaults_fit_the_data():
    assert auto_batch_size(116_677) == 500  # ML-20M: the paper's
    assert auto_batch_size(510) == 100  # ml-latest-small
    assert auto_batch_size(20_000) == 200
    vae = models.get("multvae")
    ml20m = resolve_config(vaecf.TrainConfig(), vae, 116_677)
    assert (ml20m.epochs, ml20m.batch_size, ml20m.anneal_cap) == (200, 500, 0.2)
    assert abs(ml20m.total_anneal_steps - 200_000) / 200_000 < 0.01  # the paper's, recovered
    small = resolve_config(vaecf.TrainConfig(), vae, 510)
    updates = small.epochs * math.ceil(510 / small.batch_size)
    cap_step = small.anneal_cap * small.total_anneal_steps
    assert cap_step / updates == pytest.approx(40_000 / 46_800, rel=0.01)
    assert scaled_anneal_steps(10, 10, 0.5) == round(40_000 / 46_800 * 100 / 0.5)
    assert (ml20m.lr, small.lr) == (1e-3, 1e-3)  # the paper's up to its batch
    big = resolve_config(vaecf.TrainConfig(batch_size=24_576), vae, 116_677)  # NVIDIA's batch
    assert big.lr == pytest.approx(1e-3 * math.sqrt(24_576 / 500))
    assert big.total_anneal_steps == scaled_anneal_steps(200, 5, 0.2)
    assert resolve_config(vaecf.TrainConfig(batch_size=24_576, lr=2e-3), vae, 116_677).lr == 2e-3
    small_big = resolve_config(vaecf.TrainConfig(batch_size=1_000), vae, 510)  # auto batch 100
    assert small_big.lr == pytest.approx(1e-3 * math.sqrt(10))
    paper = resolve_config(vaecf.TrainConfig(preset="paper"), vae, 510)
    assert (paper.batch_size, paper.total_anneal_steps, paper.lr) == (500, 200_000, 1e-3)
    rec = resolve_config(vaecf.TrainConfig(preset="paper"), models.get("recvae"), 510)
    assert (rec.epochs, rec.batch_size, rec.lr, rec.total_anneal_steps) == (50, 500, 5e-4, None)


def test_auto_patience_counts_updates_where_an_epoch_holds_many():
    """30 epochs up to 50 updates an epoch; beyond, 1,500 updates, at least 10 epochs. RecVAE's
    epoch is its encoder's and decoder's passes (4 by default), set by its settings."""
    vae, rec = models.get("multvae"), models.get("recvae")

    def patience(model, n, **settings):
        mcfg = model.Config(**settings) if settings else None
        return resolve_config(vaecf.TrainConfig(), model, n, mcfg).patience

    assert patience(vae, 510) == patience(rec, 510) == 30  # ml-latest-small: 6 and 24 updates
    assert patience(vae, 5_000) == 30  # 50 updates an epoch
    assert patience(vae, 45_000) == 15 and patience(rec, 45_000) == 10  # 100 and 400 updates
    assert patience(rec, 45_000, encoder_passes=1, decoder_passes=1) == 10  # 200: 7.5, floor
    assert patience(rec, 6_000, encoder_passes=1, decoder_passes=1) == 13  # 120 updates
    assert patience(vae, 116_677) == 10  # ML-20M: 234 updates an epoch
    assert resolve_config(vaecf.TrainConfig(patience=4), vae, 116_677).patience == 4  # given
    assert resolve_config(vaecf.TrainConfig(preset="paper"), vae, 116_677).patience == 0


def test_settings_that_do_not_apply_are_refused(ds, tmp_path):
    with pytest.raises(vaecf.VaecfError, match="epochs= does not apply to model='ease'"):
        vaecf.train(ds, cfg_for("ease", epochs=3), tmp_path / "e", model="ease")
    with pytest.raises(vaecf.VaecfError, match="anneal_cap= does not apply to model='recvae'"):
        vaecf.train(ds, cfg_for("recvae", anneal_cap=0.3), tmp_path / "r", model="recvae")
    with pytest.raises(vaecf.VaecfError, match="select_metric="):
        vaecf.train(ds, cfg_for("multvae", select_metric="ndcg"), tmp_path / "m")
    with pytest.raises(vaecf.VaecfError, match="not a setting of model ease"):
        models.config_from_dict("ease", {"gamma": 1.0})


def test_resume_refuses_conflicting_settings(ds, tmp_path):
    vaecf.train(ds, cfg_for("multvae", epochs=1), tmp_path / "r", model_cfg("multvae"))
    with pytest.raises(vaecf.RunError, match="lr=0.5 .* conflict"):
        vaecf.train(ds, cfg_for("multvae", epochs=2, lr=0.5), tmp_path / "r", resume=True)
    with pytest.raises(vaecf.RunError, match="cannot change the model"):
        vaecf.train(ds, cfg_for("multvae", epochs=2), tmp_path / "r", resume=True, model="ease")
    res = vaecf.train(ds, cfg_for("multvae", epochs=2), tmp_path / "r", resume=True)
    assert len(res.history) == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_recvae_trains_in_half_precision(ds, tmp_path, precision):
    res = vaecf.train(
        ds, cfg_for("recvae", epochs=2, precision=precision), tmp_path / "r", model_cfg("recvae")
    )
    rows = [json.loads(x) for x in (tmp_path / "r/metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert 0 < res.test_metrics["ndcg@100"] <= 1


def test_a_distilled_student_trains_toward_history_and_teacher_and_scores_alone(ds, tmp_path):
    """--distil d: the loss is sum_u [n_u lse_u - t_u . logits_u] with t = (1 - d) x +
    d n_u softmax(alpha x B), value and gradients (against the logits computed in full); the
    student scores without the teacher's path and, trained on planted tastes, beats
    RecVAE trained alike on the test users."""
    cfg = models.config_from_dict(
        "recvae-edlae", {**vars(model_cfg("recvae-edlae")), "distil": 0.4}
    )
    student = models.build("recvae-edlae", ds.n_items, cfg)
    student.prepare(ds.split("train"), (ds.split("validation_tr"), ds.split("validation_te")))
    assert torch.count_nonzero(student.decoder.weight) > 0  # a student starts as RecVAE does
    x = CSR.from_scipy(ds.split("train"))
    batch = x.batch(torch.arange(40))
    dense = torch.from_numpy(ds.split("train")[:40].toarray()).double()
    torch.manual_seed(0)
    z = torch.randn(40, student.decoder.weight.shape[1], dtype=torch.float64)
    w = student.decoder.weight.detach().double().requires_grad_()
    b = student.decoder.bias.detach().double().requires_grad_()
    got = student.distilled_nll(z, w, b, batch)
    got.backward()
    want_grads = [w.grad.clone(), b.grad.clone()]
    w.grad = b.grad = None
    logits = z @ w.T + b
    n_u = dense.sum(1, keepdim=True)
    q = torch.softmax(student.alpha.double() * (dense @ student.shallow.double()), dim=1)
    t = 0.6 * dense + 0.4 * n_u * q
    want = (n_u[:, 0] * torch.logsumexp(logits, 1) - (t * logits).sum(1)).sum()
    want.backward()
    # the teacher's softmax is float32, as the model holds B
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for g, r in zip(want_grads, (w.grad, b.grad)):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    # trained (20 epochs of the small network), the teacher's share shows: above RecVAE
    # trained alike (0.448 against 0.408 here) and above popularity (0.395)
    cfg.distil = 0.9
    run = vaecf.train(ds, cfg_for("recvae-edlae", epochs=20), tmp_path / "s", cfg)
    model = vaecf.Recommender.load(run.run_dir).model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.scores(batch), models.RecVAE.scores(model, batch))
    plain = vaecf.train(
        ds, cfg_for("recvae", epochs=20), tmp_path / "r", model_cfg("recvae"), model="recvae"
    )
    pop = vaecf.train(ds, cfg_for("popular"), tmp_path / "p", model="popular")
    assert run.test_metrics["ndcg@100"] > plain.test_metrics["ndcg@100"] + 0.02
    assert run.test_metrics["ndcg@100"] > pop.test_metrics["ndcg@100"] + 0.02
