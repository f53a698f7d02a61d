"""`--model auto`: the candidates are fitted without the test split, the best on validation is
kept (a blend of the best linear and best autoencoder included) and its run directory works
under the model contract; a blend scores as its formula says."""

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import vaecf
from tests.helpers import cpu_config
from vaecf import memory, models
from vaecf.config.specs import FAMILIES
from vaecf.data.matrix import CSR
from vaecf.errors import RunError
from vaecf.evaluate import evaluate_model
from vaecf.models.blend import standardise


def free_bytes(n: int):
    """In place of memory.free_memory: `n` bytes free on any device."""
    return lambda device: memory.Free(n, "MemAvailable")


@pytest.fixture(scope="module")
def ds(planted):
    return planted("auto", 600, 120, 4, 16, seed=8, heldout=70)


def quiet(**kw):
    return cpu_config(seed=3, **kw)


def test_auto_picks_the_planted_winner_without_the_test_split(ds, tmp_path):
    auto = models.AutoConfig(candidates=["popular", "ease"], blend=False, linear_cv=False)
    res = vaecf.train(ds, quiet(), tmp_path / "a", auto)
    results = json.loads((res.run_dir / "results.json").read_text())
    fit = json.loads((tmp_path / "a" / "candidates" / "ease" / "metrics.jsonl").read_text())
    assert fit["selection"] == "validation" and fit["popularity_exponent"] == 0.0
    cands = {c["model"]: c for c in results["auto"]["candidates"]}
    # planted taste groups: the item-item model must beat popularity, and auto keeps it
    assert cands["ease"]["validation"]["ndcg@100"] > cands["popular"]["validation"]["ndcg@100"]
    assert results["model"] == "ease" and results["auto"]["winner"] == "ease"
    assert results["validation"] == cands["ease"]["validation"]
    for name in cands:  # selection never scored the test split
        cand = json.loads((tmp_path / "a" / "candidates" / name / "results.json").read_text())
        assert cand["test"] is None
    # the run directory is the winner's, under the contract
    rec = vaecf.Recommender.load(res.run_dir)
    assert isinstance(rec.model, models.EASE)
    fold_in, target = (CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te"))
    assert evaluate_model(rec.model, fold_in, target)["ndcg@100"] == pytest.approx(
        results["test"]["ndcg@100"], abs=1e-9
    )
    again = vaecf.train(ds, quiet(), tmp_path / "a", auto)  # finished: read back, not refitted
    assert again.test_metrics == results["test"]
    # killed after the winner was written but before its results: a resume with no settings
    # given (as `vaecf compare` and `--resume` give none) continues with the run's own
    (tmp_path / "a" / "results.json").unlink()
    resumed = vaecf.train(ds, None, tmp_path / "a", None, resume=True, model="auto")
    again = json.loads((resumed.run_dir / "results.json").read_text())
    assert [c["model"] for c in again["auto"]["candidates"]] == ["popular", "ease"]
    assert again["test"] == results["test"]


def test_auto_blends_and_skips_what_does_not_fit(ds, tmp_path, monkeypatch):

    auto = models.AutoConfig(candidates=["edlae", "multdae", "ease"])
    cfg = quiet(epochs=4, batch_size=100)
    monkeypatch.setattr(memory, "free_memory", free_bytes(10**4))  # no n_items^2 fits
    with pytest.raises(RunError, match="no candidate could be fitted"):
        vaecf.train(ds, cfg, tmp_path / "none", models.AutoConfig(candidates=["edlae"]))
    monkeypatch.undo()
    res = vaecf.train(ds, cfg, tmp_path / "b", auto)
    results = json.loads((res.run_dir / "results.json").read_text())
    cands = {c["model"]: c for c in results["auto"]["candidates"]}
    assert set(cands) == {"edlae", "multdae", "ease", "blend"}
    for name in ("edlae", "ease"):  # the linear candidates chose on cv folds too, beta as well
        fit = json.loads((tmp_path / "b" / "candidates" / name / "metrics.jsonl").read_text())
        assert fit["selection"] == "cv" and fit["cv_users"] > 0
        assert {g["popularity_exponent"] for g in fit["grid"]} == {0.0, 0.1, 0.25, 0.4}
        assert all(g["cv"]["n_users"] == fit["cv_users"] for g in fit["grid"])
        # auto's record holds the chosen point's cv figure beside its validation one
        (chosen,) = [
            g
            for g in fit["grid"]
            if g["stage"] == "full"
            and (g["l2"], g["dropout"], g["popularity_exponent"])
            == (fit["l2"], fit.get("dropout", g["dropout"]), fit["popularity_exponent"])
        ]
        assert cands[name]["cv"] == chosen["cv"] and cands[name]["cv_users"] == fit["cv_users"]
        assert cands[name]["validation"]["ndcg@100"] == pytest.approx(
            chosen["validation"]["ndcg@100"], abs=1e-6
        )
    assert "cv" not in cands["multdae"]
    blend = cands["blend"]
    assert blend["parts"][1] == "multdae" and blend["parts"][0] in ("edlae", "ease")
    assert len(blend["weights_tried"]) == 9
    assert 0 < blend["cross_fitted"] <= 1
    sel = results["auto"]["selection"]
    assert sel["incumbent"] in ("edlae", "ease") and sel["margin_z"] == 1.645
    best = max(cands, key=lambda n: cands[n]["validation"]["ndcg@100"])
    if best == sel["incumbent"] or sel["gain"] <= 1.645 * sel["se"]:
        expected = sel["incumbent"]
    else:
        expected = best
    assert results["validation"] == cands[expected]["validation"]
    assert vaecf.Recommender.load(res.run_dir).recommend(["1"], k=5).item_ids


def test_choose_asks_a_challenger_for_a_paired_lead():
    from vaecf.training.auto import choose

    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, 400)
    noisy = base + rng.normal(0.002, 0.05, 400)  # a small lead that is noise at n = 400
    clear = base + rng.normal(0.03, 0.05, 400)  # a lead of ~12 standard errors
    assert choose({"edlae": base, "recvae": noisy}, "edlae", 1.645)[0] == "edlae"
    assert choose({"edlae": base, "recvae": noisy}, "edlae", 0.0)[0] == "recvae"
    winner, sel = choose({"edlae": base, "recvae": noisy, "blend": clear}, "edlae", 1.645)
    assert winner == "blend" and sel["challenger"] == "blend"
    diff = clear - base
    assert sel["gain"] == pytest.approx(diff.mean())
    assert sel["se"] == pytest.approx(diff.std(ddof=1) / np.sqrt(400))
    # a linear incumbent that is itself the best stays; without one, the best on validation
    assert choose({"edlae": clear, "recvae": base}, "edlae", 1.645)[0] == "edlae"
    assert choose({"multvae": base, "recvae": noisy}, None, 1.645)[0] == "recvae"
    with pytest.raises(vaecf.VaecfError, match="margin-z"):
        models.AutoConfig(margin_z=-1)


def test_a_blend_is_judged_on_users_its_weight_was_not_chosen_on():
    from vaecf.training.auto import choose, cross_fitted

    rng = np.random.default_rng(1)
    base = rng.uniform(0, 1, 300)
    # nine weights that are the linear model plus noise: the best of nine leads in sample
    noise = base + rng.normal(0.0, 0.05, (9, 300))
    xf = cross_fitted(noise)
    assert all(np.isin(xf[u], noise[:, u]) for u in range(300))  # a value of some weight
    in_sample = noise.mean(1).max() - base.mean()
    assert in_sample > 0.002  # the winner's curse
    assert xf.mean() - base.mean() < in_sample / 2
    assert choose({"edlae": base, "blend": noise[noise.mean(1).argmax()]}, "edlae", 0.0)[0] == (
        "blend"
    )
    assert choose({"edlae": base, "blend": xf}, "edlae", 1.645)[0] == "edlae"
    # a weight better for every user is what both halves choose
    better = noise.copy()
    better[4] = base + 0.2
    np.testing.assert_array_equal(cross_fitted(better), better[4])
    np.testing.assert_array_equal(cross_fitted(better[:, :1]), better[4, :1])  # one user


def test_auto_budget_skips_candidates_not_started(ds, tmp_path):
    with pytest.raises(RunError, match="budget"):
        vaecf.train(ds, quiet(budget=1e-9), tmp_path / "c", models.AutoConfig(["ease"]))


def test_a_later_candidate_needs_a_tenth_of_the_budget(ds, tmp_path, monkeypatch):
    """After the first candidate, one starts only with at least MIN_CANDIDATE_SHARE of the
    budget beyond the reserve: here the first takes 85% (a clock moved on), and the second,
    which 15% would have let start, is skipped."""
    from vaecf.training import auto as auto_module

    clock, real_train, real_time = [0.0], auto_module.train, time.perf_counter
    monkeypatch.setattr(
        auto_module, "time", SimpleNamespace(perf_counter=lambda: real_time() + clock[0])
    )

    def slow_train(*args, **kwargs):
        res = real_train(*args, **kwargs)
        clock[0] += 85.0
        return res

    monkeypatch.setattr(auto_module, "train", slow_train)
    auto = models.AutoConfig(candidates=["popular", "ease"], blend=False, linear_cv=False)
    said = []
    res = auto_module.train_auto(ds, quiet(budget=100.0), tmp_path / "b", auto, True, said.append)
    record = json.loads((res.run_dir / "results.json").read_text())["auto"]["candidates"]
    assert [c["model"] for c in record] == ["popular", "ease"]
    assert "seconds" in record[0] and "budget" in record[1]["skipped"]
    # and says so, with what would let auto compare them
    (note,) = [s for s in said if s.startswith("auto: only popular was judged")]
    assert "no time for ease" in note and "budget=" in note


def test_the_first_candidate_leaves_the_next_its_share(ds, tmp_path, monkeypatch):
    """The first of several candidates is given the budget less the reserve and the next
    candidate's tenth, so that a slow first one (EDLAE on a loaded machine) cannot leave auto
    comparing nothing; the last is given all that is left."""
    from vaecf.training import auto as auto_module

    given, real_train = [], auto_module.train

    def train(ds, cfg, *args, **kwargs):
        given.append(cfg.budget)
        return real_train(ds, cfg, *args, **kwargs)

    monkeypatch.setattr(auto_module, "train", train)
    auto = models.AutoConfig(candidates=["popular", "ease"], blend=False, linear_cv=False)
    vaecf.train(ds, quiet(budget=100.0), tmp_path / "b", auto)
    share = auto_module.BUDGET_RESERVE + auto_module.MIN_CANDIDATE_SHARE
    assert len(given) == 2 and given[0] <= 100.0 * (1 - share) < given[1]
    assert (
        auto_module.BUDGET_RESERVE + auto_module.MIN_CANDIDATE_SHARE
        > 0.15
        > (auto_module.BUDGET_RESERVE)
    )


def test_blend_scores_its_formula(ds):
    torch.manual_seed(0)
    parts = [models.build("ease", ds.n_items, {"l2": 10.0}), models.build("multdae", ds.n_items)]
    parts[0].fit(ds.split("train"))
    cfg = models.config_from_dict(
        "blend",
        {"parts": ["ease", "multdae"], "configs": [{"l2": 10.0}, {}], "weight": 0.3},
    )
    blend = models.build("blend", ds.n_items, cfg).eval()
    for sub, p in zip(blend.parts, parts):
        sub.load_state_dict(p.eval().state_dict())
    batch = CSR.from_scipy(ds.split("test_tr")).batch(torch.arange(6))
    with torch.no_grad():
        a, b = (p.scores(batch).double().numpy() for p in parts)
        got = blend.scores(batch).double().numpy()
    z = [(s - s.mean(1, keepdims=True)) / s.std(1, ddof=1, keepdims=True) for s in (a, b)]
    assert np.allclose(got, 0.3 * z[0] + 0.7 * z[1], atol=1e-4)
    s = standardise(torch.randn(3, 50) * 7 + 2)
    assert torch.allclose(s.mean(1), torch.zeros(3), atol=1e-5)
    with pytest.raises(vaecf.VaecfError, match="made by --model auto"):
        vaecf.train(ds, quiet(), "/nonexistent/x", model="blend")


def test_readme_model_table_matches_the_declarations():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        if line.startswith("| `") and line.count("|") >= 5:
            cells = [c.strip() for c in line.strip("|").split("|")]
            name = cells[0].split("`")[1]
            if cells[1] in FAMILIES:  # the model table's rows (not the accuracy table's)
                rows[name] = cells[1]
    assert rows == {m["name"]: m["family"] for m in models.describe()}


def test_linear_candidates_cross_validate_only_where_validation_users_are_few():
    from vaecf.training.auto import CV_ENOUGH_USERS, candidate_model_config

    auto = models.AutoConfig()
    few = candidate_model_config("edlae", auto, n_validation=CV_ENOUGH_USERS - 1)
    assert few is not None and few.selection == "cv"
    many = candidate_model_config("edlae", auto, n_validation=CV_ENOUGH_USERS)
    assert many.selection == "validation" and many.popularity_grid == few.popularity_grid
    assert candidate_model_config("edlae", auto, timed=True, n_validation=60) is None
    assert candidate_model_config("multvae", auto, n_validation=60) is None
