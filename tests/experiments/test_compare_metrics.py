"""Choice by any metric: `vaecf compare --metrics` (every run scored again, by history-length
slice, paired over the splits and, on one split, user by user) and `vaecf tune
--select-metric` (trials judged by it, recorded in the study)."""

import json

import numpy as np
import pytest
from scipy import stats

import vaecf
from tests.helpers import cli_in_process, cpu_config
from vaecf.experiments import compare
from vaecf.experiments.rescore import rescore
from vaecf.run_evaluation import evaluate_run


@pytest.fixture(scope="module")
def runs(planted, tmp_path_factory):
    ds = planted("cmpm", 500, 100, 4, 12, 5, 80)
    root = tmp_path_factory.mktemp("cmpm")
    for name in ("ease", "popular"):
        vaecf.train(ds, cpu_config(seed=1), root / name, model=name)
    return ds, root


def test_paired_by_user_matches_a_direct_t_test(runs):
    _, root = runs
    records = compare.read_runs([str(root / "ease"), str(root / "popular")])
    keys = rescore(records, ("map@10", "hit@5", "coverage@10"), "cpu")
    assert keys[:3] == ["map@10", "hit@5", "coverage@10"]
    assert any(k.startswith("map@10 [") for k in keys)  # the slices every run has
    s = compare.summarize(records, keys)
    by = {r["metric"]: r for r in s["by_user"]}
    a = evaluate_run(root / "ease", metrics=("map@10",), device="cpu").per_user
    b = evaluate_run(root / "popular", metrics=("map@10",), device="cpu").per_user
    both = a.join(b, on="user_id", suffix=":p")
    x, y = both["map@10:p"].to_numpy(), both["map@10"].to_numpy()
    assert by["map@10"]["n"] == both.height
    assert by["map@10"]["diff_mean"] == pytest.approx(float(np.mean(x - y)), abs=1e-12)
    assert by["map@10"]["p"] == pytest.approx(stats.ttest_rel(x, y).pvalue, rel=1e-9)
    summary = {(r["label"], r["metric"]): r for r in s["summary"]}
    assert summary[("popular", "map@10")]["diff_mean"] == pytest.approx(
        by["map@10"]["diff_mean"], abs=1e-12
    )  # one split: the split's difference is the users' mean difference
    assert "coverage@10" not in by  # a catalogue metric has no per-user values


def test_compare_cli_prints_the_user_pairs(runs, tmp_path, capsys):
    _, root = runs
    args = ["compare", root / "ease", root / "popular", "--out", tmp_path / "c", "--no-plot",
            "--metrics", "ndcg@100,mrr@10"]  # fmt: skip
    rc, err = cli_in_process(args)
    assert rc == 0, err
    saved = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert {r["metric"] for r in saved["by_user"]} >= {"ndcg@100", "mrr@10"}
    rc, err = cli_in_process([*args[:-1], "ndcg@100,auc@3"])
    assert rc == 2 and "unknown metric 'auc@3'" in err


def test_tune_judges_trials_by_the_select_metric(runs, tmp_path):
    ds, _ = runs
    out = tmp_path / "study"
    args = ["tune", "--data", ds.path, "--out", out, "--model", "ease", "--trials", "2"]
    rc, err = cli_in_process([*args, "--select-metric", "mrr@10", "--seed", "3"])
    assert rc == 0, err
    best = json.loads((out / "best.json").read_text())
    assert best["train"]["select_metric"] == "mrr@10" and "mrr@10" in best["validation"]
    # the best trial is the one with the highest validation mrr@10
    runs = [json.loads(p.read_text()) for p in out.glob("trials/*/results.json")]
    assert best["validation"]["mrr@10"] == max(r["validation"]["mrr@10"] for r in runs)
    rc, err = cli_in_process(["tune", "--data", ds.path, "--out", tmp_path / "s2", "--model",
                              "ease", "--trials", "1", "--select-metric", "gini@10"])  # fmt: skip
    assert rc == 2 and "chosen by accuracy" in err and not (tmp_path / "s2").exists()
