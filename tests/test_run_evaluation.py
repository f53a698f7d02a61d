"""`vaecf evaluate` beyond the paper's three metrics: any metric by name, each scored user's
values (their means are the summary), the means by history-length slice, and bad input in
one line with exit 2."""

import json

import polars as pl
import pytest

import vaecf
from tests.helpers import cli_in_process, cpu_config
from vaecf.errors import ConfigError
from vaecf.metrics import NAMES
from vaecf.run_evaluation import evaluate_run, parse_metrics

EVERY = [f"{m}@10" for m in NAMES] + ["ndcg@100"]
PER_USER = [m for m in EVERY if not m.startswith(("coverage", "gini"))]


@pytest.fixture(scope="module")
def run(planted, tmp_path_factory):
    ds = planted("runeval", 400, 120, 4, 12, 3, 60)
    out = tmp_path_factory.mktemp("runeval") / "run"
    vaecf.train(ds, cpu_config(seed=0), out, model="ease")
    return out


def test_per_user_values_average_to_the_summary_and_slices_partition_them(run):
    ev = evaluate_run(run, metrics=EVERY, device="cpu")
    assert ev.per_user.height == ev.summary["n_users"] > 0
    assert ev.per_user.columns == ["user_id", "history", *PER_USER]
    for m in PER_USER:
        assert ev.per_user.get_column(m).mean() == pytest.approx(ev.summary[m], abs=1e-12)
    assert sum(s["n_users"] for s in ev.slices) == ev.summary["n_users"]
    for m in PER_USER:  # the slices' means weighted by their users give the summary back
        pooled = sum(s[m] * s["n_users"] for s in ev.slices) / ev.summary["n_users"]
        assert pooled == pytest.approx(ev.summary[m], abs=1e-12)
    assert 0 < ev.summary["coverage@10"] <= 1 and 0 <= ev.summary["gini@10"] < 1
    assert ev.per_user.get_column("history").min() >= 1
    # the test split's users, by their raw ids, as users.parquet lists them
    users = vaecf.PreparedDataset(json.loads((run / "config.json").read_text())["data"]["path"])
    test_ids = users.users.filter(pl.col("split") == "test").get_column("user_id").to_list()
    assert set(ev.per_user.get_column("user_id").to_list()) <= set(test_ids)


def test_the_default_metrics_reproduce_results_json(run):
    ev = evaluate_run(run, device="cpu")
    results = json.loads((run / "results.json").read_text())["test"]
    for m in ("recall@20", "recall@50", "ndcg@100"):
        assert ev.summary[m] == pytest.approx(results[m], abs=1e-6)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_the_cli_writes_the_per_user_file_and_prints_slices(run, tmp_path, suffix, capsys):
    out = tmp_path / f"users{suffix}"
    args = ["evaluate", run, "--metrics", "map@10,coverage@10", "--per-user", out, "--json"]
    rc, err = cli_in_process(args)
    assert rc == 0, err
    frame = pl.read_csv(out) if suffix == ".csv" else pl.read_parquet(out)
    assert frame.columns == ["user_id", "history", "map@10"]
    assert frame.height > 0


def test_bad_metric_names_and_files_are_one_line_and_exit_2(run, tmp_path):
    for args, words in (
        (["--metrics", "auc@10"], "unknown metric 'auc@10'"),
        (["--metrics", "map"], "unknown metric 'map'"),
        (["--per-user", tmp_path / "u.xlsx"], "name a .csv or .parquet file"),
    ):
        rc, err = cli_in_process(["evaluate", run, *args])
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "u.xlsx").exists()
    with pytest.raises(ConfigError, match="empty"):
        parse_metrics(" , ")
