"""Runs written by earlier releases still load and answer the same; a run newer than the code
says which version wrote it.

tests/fixtures/runs/COMMIT/MODEL/ are real run directories (every model family that commit
had) written by that commit's code on a small planted dataset, with answers.json: the top 5 of
four histories as that code answered them (`python tests/fixtures/runs/make_runs.py OUT`, run
with the commit's src on PYTHONPATH, wrote them; only what loading reads is kept).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import vaecf
from tests.helpers import cli_in_process
from vaecf import models, rundir
from vaecf.errors import RunError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
RUNS = sorted(p for p in FIXTURES.glob("*/*") if rundir.is_run(p))


def test_there_are_old_runs_of_every_family():
    families = {models.get(p.name).family for p in RUNS}
    assert families >= {"autoencoder", "linear", "baseline"}
    assert len({p.parent.name for p in RUNS}) >= 3  # three earlier commits
    assert all(json.loads((p / "config.json").read_text()).get("format_version") is None
               for p in RUNS)  # fmt: skip  # written before the field: format 1


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
