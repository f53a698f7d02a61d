"""Runs written by earlier releases still load and answer the same; a run newer than the code
says which version wrote it.

tests/fixtures/runs/COMMIT/MODEL/ are real run directories (every model family that commit
had) written by that commit's code on a small planted dataset, with answers.json: the top 5 of
four histories as that code answered them (`python tests/fixtures/runs/make_runs.py OUT`, run
with the commit's src on PYTHONPATH, wrote them; only what loading reads is kept). Each model's
oldest and newest fixture is also updated (`vaecf update`) onto a newer export of that data.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import vaecf
from tests.helpers import cli_in_process
from vaecf import models, rundir
from vaecf.data import synthetic
from vaecf.errors import RunError
from vaecf.training.update import update

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
RUNS = sorted(p for p in FIXTURES.glob("*/*") if rundir.is_run(p))


def fmt(run: Path) -> int:
    return json.loads((run / "config.json").read_text()).get("format_version", 1)


def test_there_are_old_runs_of_every_family():
    families = {models.get(p.name).family for p in RUNS}
    assert families >= {"autoencoder", "linear", "baseline"}
    assert len({p.parent.name for p in RUNS}) >= 4  # four earlier commits
    # written before the field (format 1) and by the release that added diag P (format 3)
    assert {fmt(p) for p in RUNS} >= {1, 3} and max(map(fmt, RUNS)) <= rundir.RUN_FORMAT


@pytest.mark.parametrize("run", RUNS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_an_old_run_answers_as_it_did(run):
    saved = json.loads((run.parent / "answers.json").read_text())
    rec = vaecf.Recommender.load(run)
    for history, then in zip(saved["histories"], saved["answers"][run.name]):
        now = rec.recommend(history, k=5).to_dict()
        was = [i["score"] for i in then["items"]]
        got = [i["score"] for i in now["items"]]
        # the same scores, rank by rank; the same items wherever their scores are not near-ties
        np.testing.assert_allclose(got, was, rtol=1e-4, atol=1e-7)
        for a, b, s in zip(now["items"], then["items"], was):
            if sum(abs(s - t) < 1e-5 for t in was) == 1:
                assert a["item_id"] == b["item_id"], (run, history)
        assert now["fallback"] == then["fallback"]


def test_a_newer_run_names_the_version_that_wrote_it(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUNS[0], run)
    cfg = json.loads((run / "config.json").read_text())
    cfg.update(format_version=rundir.RUN_FORMAT + 1, vaecf_version="9.9.9")
    (run / "config.json").write_text(json.dumps(cfg))
    n = rundir.RUN_FORMAT
    said = rf"written by vaecf 9\.9\.9 in run format {n + 1}; this vaecf reads run formats 1 to {n}"
    with pytest.raises(RunError, match=said + ": upgrade vaecf"):
        vaecf.Recommender.load(run)
    rc, err = cli_in_process(["recommend", run, "--items", "1,2"])
    assert rc == 2 and "upgrade vaecf" in err and len(err.strip().splitlines()) == 1


def test_a_new_run_records_its_format_and_the_code_that_wrote_it(planted, tmp_path):
    ds = planted("formats", 120, 30, 3, 6, 0, 10)
    vaecf.train(ds, vaecf.TrainConfig(device="cpu", progress=False), tmp_path / "r", model="ease")
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["format_version"] == rundir.RUN_FORMAT
    assert cfg["vaecf_version"] == vaecf.__version__


def ends() -> list[Path]:
    """Of each model, its fixture of the oldest run format and of the newest."""
    runs: dict[str, list[Path]] = {}
    for p in RUNS:
        runs.setdefault(p.name, []).append(p)
    return sorted({q for rs in runs.values() for q in (min(rs, key=fmt), max(rs, key=fmt))})


@pytest.fixture(scope="module")
def newer(tmp_path_factory):
    """A newer export of the data the fixtures were trained on (make_runs.py's): the same
    interactions and 30 more users."""
    df = synthetic.generate(n_users=240, n_items=40, n_groups=4, mean_items=8, seed=0)
    more = synthetic.generate(n_users=30, n_items=40, n_groups=4, mean_items=8, seed=1)
    df = pl.concat([df, more.with_columns(pl.col("user_id") + 1000)])
    out = tmp_path_factory.mktemp("formats") / "newer"
    return vaecf.prepare_frame(df, out, vaecf.PrepareSettings(heldout_users=20, seed=0))


@pytest.mark.parametrize("run", ends(), ids=lambda p: f"{p.parent.name}-{p.name}")
def test_an_old_run_is_kept_current(run, newer, tmp_path):
    """`vaecf update` of a run an earlier release wrote: a run of this format that answers the
    newer data's users; a linear model's the same as a fit at the settings the run chose."""
    if models.get(run.name).family == "selection":
        pytest.skip("auto's choice is trained again, not updated")
    got = update(run, newer, tmp_path / "upd", progress=False, device="cpu")
    assert fmt(tmp_path / "upd") == rundir.RUN_FORMAT
    assert 0 < got.test_metrics["ndcg@100"] <= 1
    rec = vaecf.Recommender.load(tmp_path / "upd")
    user = newer.users.filter(pl.col("user_id") >= 1000).get_column("user_id")[0]  # a new user
    got_user = rec.recommend_user(user, k=5)
    assert rec.model.n_items == newer.n_items and not got_user.fallback
    assert len(got_user.item_ids) == 5 and not set(got_user.item_ids) & set(rec.user_history(user))
    if models.get(run.name).closed_form:
        saved = rundir.load_config(tmp_path / "upd")["model"]["config"]
        cfg = vaecf.TrainConfig(seed=0, device="cpu", precision="fp32", progress=False)
        mcfg = models.config_from_dict(run.name, saved)
        fit = vaecf.train(newer, cfg, tmp_path / "fit", mcfg, model=run.name)
        assert got.test_metrics == pytest.approx(fit.test_metrics, rel=1e-5, abs=1e-7)
