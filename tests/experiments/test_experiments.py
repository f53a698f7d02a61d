"""Experiments: settings files (train --config, config.toml), tune (known best, resume after
SIGKILL), compare (paired t-test against scipy, resumable), plots, the TensorBoard extra."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import vaecf
from vaecf import models, rundir
from vaecf.cli import main
from vaecf.config import toml as configfile
from vaecf.data import synthetic
from vaecf.errors import ConfigError, RunError

optuna = pytest.importorskip("optuna")
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def tiny(planted):
    return planted("exp", 600, 150, 5, 15, seed=3, heldout=80)


def fast(**kw):
    return vaecf.TrainConfig(
        **{"epochs": 3, "batch_size": 100, "device": "cpu", "precision": "fp32", **kw},
        progress=False,
    )


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    mv = vaecf.train(
        tiny,
        fast(),
        root / "mv",
        models.config_from_dict("multvae", {"hidden_dims": [40], "latent_dim": 20}),
    )
    ease = vaecf.train(
        tiny, vaecf.TrainConfig(progress=False, device="cpu"), root / "ease", model="ease"
    )
    return {"multvae": mv.run_dir, "ease": ease.run_dir}


def cli(*args) -> int:
    return main([str(a) for a in args])


# -- settings files -----------------------------------------------------------------------------
def test_every_run_writes_config_toml(runs):
    for run in runs.values():
        saved = rundir.load_config(run)
        s = configfile.read(run / "config.toml")
        assert s.model == saved["model"]["name"]
        assert s.data == saved["data"]["path"]
        train = {k: v for k, v in saved["train"].items() if v is not None and k != "progress"}
        assert s.train == train
        model = {k: v for k, v in saved["model"]["config"].items() if v is not None}
        assert s.model_config == model


@pytest.mark.parametrize("name", ["multvae", "ease"])
def test_train_config_toml_repeats_the_run(runs, tmp_path, name):
    """`train --config RUN/config.toml` gives the run's config.json again (the data too)."""
    run = runs[name]
    assert (
        cli("train", "--config", run / "config.toml", "--out", tmp_path / "again", "--quiet") == 0
    )
    a = json.loads((run / "config.json").read_text())
    b = json.loads((tmp_path / "again" / "config.json").read_text())
    assert a == b
    if name == "multvae":  # same seed, same settings: the same model
        ra, rb = rundir.load_results(run), rundir.load_results(tmp_path / "again")
        assert ra["validation"]["ndcg@100"] == pytest.approx(rb["validation"]["ndcg@100"])


def test_flags_override_the_file(runs, tmp_path):
    run = runs["multvae"]
    assert (
        cli(
            "train",
            "--config",
            run / "config.toml",
            "--out",
            tmp_path / "o",
            "--quiet",
            "--lr",
            "0.01",
            "--epochs",
            "1",
            "--latent-dim",
            "20",
        )
        == 0
    )
    cfg = rundir.load_config(tmp_path / "o")
    assert cfg["train"]["lr"] == 0.01 and cfg["train"]["epochs"] == 1
    assert cfg["model"]["config"]["latent_dim"] == 20
    assert cfg["model"]["config"]["hidden_dims"] == [40]  # from the file


def test_settings_file_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="not a training setting"):
        configfile.loads("[train]\nepochz = 3\n")
    with pytest.raises(ConfigError, match="unknown"):
        configfile.loads("data = 'x'\n[extra]\na = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        configfile.loads("[train\n")
    s = configfile.loads('[model]\nname = "recvae"\ngamma = 0.01\n')
    assert (s.model, s.model_config) == ("recvae", {"gamma": 0.01})
    assert configfile.loads('model = "popular"').model == "popular"
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nname = "ease"\nl3 = 4.0\n')
    assert cli("train", "--config", bad, "--data", tmp_path, "--out", tmp_path / "r") == 2
    assert "l3 is not a setting of model ease" in capsys.readouterr().err


# -- tune -----------------------------------------------------------------------------------------
L2_CHOICES = [1.0, 60.0, 1e5]


def l2_space(trial, n_train_users):
    return {"train": {}, "model": {"l2": trial.suggest_categorical("l2", L2_CHOICES)}}


def test_tune_finds_the_known_best(tiny, tmp_path):
    """EASE over three lambdas: the study's best is the lambda whose own run validates best,
    with the same value; only that trial's test split is scored."""
    truth = {}
    for l2 in L2_CHOICES:
        r = vaecf.train(
            tiny,
            vaecf.TrainConfig(progress=False, device="cpu"),
            tmp_path / f"l2-{l2:g}",
            models.config_from_dict("ease", {"l2": l2}),
        )
        truth[l2] = r.validation_metrics["ndcg@100"]
    assert max(truth.values()) - sorted(truth.values())[-2] > 0.01  # one is clearly best
    from vaecf.experiments import tune

    res = tune.tune(
        tiny, tmp_path / "study", "ease", trials=4, seed=1, space=l2_space, log=lambda s: None
    )
    tried = {r["param:l2"] for r in res.rows}
    assert tried == set(L2_CHOICES)  # every choice was tried, so the best is known
    best_l2 = max(truth, key=truth.get)
    assert res.rows[res.best_trial]["param:l2"] == best_l2
    assert res.best_value == pytest.approx(truth[best_l2], abs=1e-6)
    s = configfile.read(tmp_path / "study" / "best.toml")
    assert (s.model, s.model_config["l2"]) == ("ease", best_l2)
    scored = [
        r["trial"]
        for r in res.rows
        if rundir.load_results(tmp_path / "study" / r["run_dir"])["test"] is not None
    ]
    assert scored == [res.best_trial]
    assert (tmp_path / "study" / "trials.csv").read_text().count("\n") == 5
    for png in ("history.png", "importance.png"):
        assert (tmp_path / "study" / png).stat().st_size > 5000
    # `vaecf train --config best.toml` (its data included) reproduces the best trial
    assert (
        cli(
            "train",
            "--config",
            tmp_path / "study" / "best.toml",
            "--out",
            tmp_path / "a",
            "--quiet",
        )
        == 0
    )
    again = rundir.load_results(tmp_path / "a")["validation"]["ndcg@100"]
    assert again == pytest.approx(res.best_value, abs=1e-6)


def test_tune_prunes_a_trial_below_the_median(tiny, tmp_path, monkeypatch):
    """The median pruner, fed every validated epoch: after the startup trials, a trial that
    cannot learn (lr 1e-12) falls below their median after the warm-up epochs and is stopped
    there; it counts as pruned, keeps no resume checkpoint, and the best is a learning trial."""
    from vaecf.experiments import study, tune

    monkeypatch.setattr(study, "PRUNE_AFTER_TRIALS", 3)
    monkeypatch.setattr(study, "PRUNE_AFTER_EPOCHS", 2)

    def space(trial, n_train_users):
        lr = 1e-12 if trial.number == 3 else 3e-3
        trial.set_user_attr("lr", lr)
        return {"train": {"lr": lr, "epochs": 8, "batch_size": 100, "precision": "fp32",
                          "device": "cpu", "checkpoint_every": 0},
                "model": {"hidden_dims": [], "latent_dim": 16}}  # fmt: skip

    lines = []
    res = tune.tune(tiny, tmp_path / "s", "multvae", trials=4, seed=0, space=space,
                    log=lines.append, plots=False)  # fmt: skip
    states = {t.number: t.state.name for t in _study(tmp_path / "s").trials}
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "COMPLETE", 3: "PRUNED"}, lines
    # pruning starts at epoch PRUNE_AFTER_EPOCHS (Optuna: a step below n_warmup_steps is exempt)
    assert any("trial    3  pruned (epoch 2:" in line for line in lines), lines
    assert res.best_trial != 3
    pruned = tmp_path / "s" / "trials" / "0003"
    assert len(rundir.read_metrics(pruned)) == 2  # it stopped there, of 8 epochs
    assert not (pruned / rundir.LAST).exists()  # and will not be resumed: no checkpoint kept


def test_tune_refusals(tiny, tmp_path):
    from vaecf.experiments import tune

    with pytest.raises(ConfigError, match="popular has no hyper-parameters"):
        tune.tune(tiny, tmp_path / "p", "popular", trials=1)
    with pytest.raises(ConfigError, match="--fix nope: not a parameter"):
        tune.tune(tiny, tmp_path / "f", "ease", trials=1, fixed={"nope": 1})
    assert not (tmp_path / "p").exists() and not (tmp_path / "f").exists()
    tune.tune(tiny, tmp_path / "s", "ease", trials=1, seed=0, log=lambda s: None, plots=False)
    with pytest.raises(RunError, match="--resume"):
        tune.tune(tiny, tmp_path / "s", "ease", trials=1)
    with pytest.raises(RunError, match="cannot change --model"):
        tune.tune(tiny, tmp_path / "s", "multvae", trials=1, resume=True)


def test_tune_ctrl_c_and_timeout_resume(tiny, tmp_path, monkeypatch):
    """A trial stopped by Ctrl-C or by --timeout is failed, flagged, and continued by --resume
    with its parameters (and, for --timeout, from its run directory's checkpoint)."""
    from vaecf.experiments import tune

    quiet = {"log": lambda s: None, "plots": False}

    def interrupting(trial, n):
        drawn = l2_space(trial, n)
        if trial.number == 1:
            raise KeyboardInterrupt
        return drawn

    with pytest.raises(KeyboardInterrupt):
        tune.tune(tiny, tmp_path / "s", "ease", trials=3, seed=1, space=interrupting, **quiet)
    tune.tune(tiny, tmp_path / "s", "ease", trials=3, seed=1, space=l2_space, resume=True, **quiet)
    t = _study(tmp_path / "s").trials
    assert t[1].state.name == "FAIL" and t[1].user_attrs["interrupted"] == "ctrl-c"
    assert t[2].user_attrs["retry_of"] == 1 and t[2].params == t[1].params
    assert [x.state.name for x in t] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]

    def chained(trial, n):  # Ctrl-C inside a library that raises its own error (torch.save)
        drawn = l2_space(trial, n)
        if trial.number == 0:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("unexpected pos") from None
        return drawn

    with pytest.raises(KeyboardInterrupt):
        tune.tune(tiny, tmp_path / "s2", "ease", trials=1, seed=1, space=chained, **quiet)
    assert _study(tmp_path / "s2").trials[0].user_attrs["interrupted"] == "ctrl-c"

    fixed = {"epochs": 3, "hidden_dim": 0, "latent_dim": 20, "batch_size": 100}
    clock = {"now": 0.0}  # the timeout passes once the first trial has started
    monkeypatch.setattr(tune.time, "monotonic", lambda: clock["now"])

    def space(trial, n):
        if isinstance(getattr(trial, "number", None), int):  # a trial, not the names' probe
            clock["now"] = 1e9
        return models.get("multvae").search_space(trial, n)

    tune.tune(
        tiny,
        tmp_path / "m",
        "multvae",
        trials=1,
        seed=0,
        timeout=60,
        fixed=fixed,
        space=space,
        base=configfile.RunSettings(train={"checkpoint_every": 0}),
        **quiet,
    )
    t = _study(tmp_path / "m").trials
    assert t[0].state.name == "FAIL" and t[0].user_attrs["interrupted"] == "timeout"
    stopped = rundir.read_metrics(tmp_path / "m" / "trials" / "0000")
    assert len(stopped) == 1
    monkeypatch.undo()
    res = tune.tune(tiny, tmp_path / "m", "multvae", trials=1, resume=True, **quiet)
    t = _study(tmp_path / "m").trials
    assert t[1].state.name == "COMPLETE" and t[1].user_attrs["retry_of"] == 0
    assert [r["epoch"] for r in rundir.read_metrics(tmp_path / "m" / "trials" / "0001")] == [
        1,
        2,
        3,
    ]
    assert rundir.read_metrics(tmp_path / "m" / "trials" / "0001")[0] == stopped[0]  # continued
    assert res.best_trial == 1 and res.test is not None


@pytest.mark.parametrize("name", ["multvae", "multdae", "recvae", "ease"])
def test_search_spaces_give_valid_settings(tiny, name):
    from vaecf.training.single import resolve_config

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(5):
        drawn = models.get(name).search_space(study.ask(), 500)
        cfg = resolve_config(vaecf.TrainConfig(**drawn["train"]), models.get(name), 500)
        cfg.validate()
        models.config_from_dict(name, drawn["model"])


def _study(path):
    return optuna.load_study(study_name="vaecf", storage=f"sqlite:///{path / 'study.db'}")


def test_tune_resume_does_not_requeue_a_trial_killed_before_its_parameters(tiny, tmp_path):
    """Found by the tune kill drill: a tune killed right after Optuna opened a trial, before the
    search space had drawn its parameters, left a RUNNING trial with none; --resume queued
    that as a "retry" of it: a new trial labelled as repeating the killed one, with parameters
    drawn afresh. Now a trial without parameters is not queued again."""
    from vaecf.experiments import tune

    study_dir = tmp_path / "study"
    tune.tune(tiny, study_dir, "ease", trials=1, seed=1, space=l2_space, log=lambda s: None)
    study = _study(study_dir)
    study.ask()  # what the killed process left: RUNNING, no parameters
    half = study.ask()
    half.suggest_categorical("l2", L2_CHOICES)  # drawn, killed before training
    started = study.ask()
    started.suggest_categorical("l2", L2_CHOICES)
    started.set_user_attr("run_dir", "trials/0003")  # killed while training
    res = tune.tune(
        tiny, study_dir, "ease", trials=3, resume=True, space=l2_space, log=lambda s: None
    )
    after = _study(study_dir).trials
    assert [t.state.name for t in after[1:4]] == ["FAIL"] * 3
    retries = {t.user_attrs["retry_of"]: t for t in after if "retry_of" in t.user_attrs}
    assert set(retries) == {2, 3}  # not 1
    assert all(
        r.params == after[n].params and r.state.name == "COMPLETE" for n, r in retries.items()
    )
    assert sum(t.state.name == "COMPLETE" for t in after) == 3 == len(res.rows) - 3


def test_tune_resume_does_not_requeue_a_trial_killed_halfway_through_its_draw(tiny, tmp_path):
    """Found by the tune kill drill in the suite (seed 322716): a kill between two draws left a
    trial with some of its parameters; --resume queued those, and the "retry" drew the rest
    afresh. A trial is queued again only when its parameters are a whole draw of the space."""
    from vaecf.experiments import tune

    def two(trial, n):
        l2 = trial.suggest_categorical("l2", L2_CHOICES)
        return {"train": {}, "model": {"l2": l2 * trial.suggest_categorical("x", [1.0, 2.0])}}

    study_dir = tmp_path / "study"
    tune.tune(tiny, study_dir, "ease", trials=1, seed=1, space=two, log=lambda s: None)
    study = _study(study_dir)
    part = study.ask()
    part.suggest_categorical("l2", L2_CHOICES)  # killed before it drew x
    whole = study.ask()
    whole.suggest_categorical("l2", L2_CHOICES)
    whole.suggest_categorical("x", [1.0, 2.0])
    tune.tune(tiny, study_dir, "ease", trials=3, resume=True, space=two, log=lambda s: None)
    after = _study(study_dir).trials
    retries = {t.user_attrs["retry_of"]: t for t in after if "retry_of" in t.user_attrs}
    assert set(retries) == {2}  # not 1
    assert retries[2].params == after[2].params and retries[2].state.name == "COMPLETE"
    assert sum(t.state.name == "COMPLETE" for t in after) == 3


def test_tune_resume_requeues_a_trial_whose_retry_was_killed_before_drawing(tiny, tmp_path):
    """Found by the tune kill drill in the suite (seed 76212): trial 1 killed while training,
    --resume queued its parameters as trial 2, and a second kill came after Optuna opened
    trial 2 but before it took them; the next --resume counted trial 2 as trial 1's retry and
    ran neither: trial 1's parameters were lost. Now they are queued once more."""
    from vaecf.experiments import study as study_mod
    from vaecf.experiments import tune

    study_dir = tmp_path / "study"
    tune.tune(tiny, study_dir, "ease", trials=1, seed=1, space=l2_space, log=lambda s: None)
    study = _study(study_dir)
    killed = study.ask()
    killed.suggest_categorical("l2", L2_CHOICES)
    killed.set_user_attr("run_dir", "trials/0001")  # killed while training
    storage = optuna.storages.RDBStorage(f"sqlite:///{study_dir / 'study.db'}")
    study_mod.recover(study, storage, lambda s: None, lambda p: True)  # the first --resume
    retry = study.ask()  # ... opened the queued retry and was killed before its draw
    assert retry.user_attrs["retry_of"] == killed.number and retry.params == {}
    tune.tune(tiny, study_dir, "ease", trials=3, resume=True, space=l2_space, log=lambda s: None)
    after = _study(study_dir).trials
    again = [t for t in after[3:] if t.user_attrs.get("retry_of") == killed.number]
    assert len(again) == 1 and again[0].params == killed.params
    assert again[0].state.name == "COMPLETE"


def test_tune_resumes_after_sigkill(tiny, tmp_path):
    """SIGKILL a real `vaecf tune` in its third trial; --resume keeps the finished trials once,
    marks the killed one failed, continues its run directory and completes the study."""
    study_dir = tmp_path / "study"
    base = tmp_path / "base.toml"
    base.write_text("[train]\ncheckpoint_every = 0\n")  # last.pt after every epoch
    args = [
        sys.executable,
        "-m",
        "vaecf",
        "tune",
        "--config",
        str(base),
        "--data",
        str(tiny.path),
        "--out",
        str(study_dir),
        "--model",
        "multvae",
        "--trials",
        "3",
        "--seed",
        "0",
        "--device",
        "cpu",
        "--fix",
        "epochs=8",
        "--fix",
        "hidden_dim=0",
        "--fix",
        "latent_dim=20",
        "--fix",
        "batch_size=100",
    ]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    third = study_dir / "trials" / "0002" / "last.pt"  # the third trial is under way
    deadline = time.monotonic() + 120
    while not third.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()

    before = {t.number: t for t in _study(study_dir).trials}
    done = {n: t for n, t in before.items() if t.state.name == "COMPLETE"}
    running = [n for n, t in before.items() if t.state.name == "RUNNING"]
    assert {0, 1} <= set(done) and running == [2]
    killed_rows = rundir.read_metrics(study_dir / "trials" / "0002")
    killed_epochs = len(killed_rows)
    assert killed_epochs >= 1

    out = subprocess.run(
        [*args[:-8], "--resume"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    after = _study(study_dir).trials
    for n, t in done.items():  # finished trials: the same, once
        assert after[n].state.name == "COMPLETE"
        assert (after[n].params, after[n].value) == (t.params, t.value)
    assert after[2].state.name == "FAIL" and after[2].user_attrs["interrupted"] == "killed"
    retry = [t for t in after if t.user_attrs.get("retry_of") == 2]
    assert len(retry) == 1 and retry[0].params == before[2].params
    assert retry[0].state.name in ("COMPLETE", "PRUNED")
    counted = [t for t in after if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(counted) == 3
    assert len({json.dumps(t.params, sort_keys=True) for t in counted}) == 3
    # the retry continued the killed trial's run directory, epoch by epoch without repeats
    assert not (study_dir / "trials" / "0002").exists()
    rows = rundir.read_metrics(study_dir / "trials" / f"{retry[0].number:04d}")
    assert [r["epoch"] for r in rows] == list(range(1, len(rows) + 1))
    assert len(rows) >= killed_epochs
    assert rows[0] == killed_rows[0]  # continued, not trained again (its timings would differ)
    assert (study_dir / "best.toml").is_file()
    assert "trial" in out.stdout and "best: trial" in out.stdout
    # finished trials keep best.pt, not last.pt: continuing one is refused, not restarted
    with pytest.raises(RunError, match="no last.pt"):
        vaecf.train(tiny, None, study_dir / "trials" / "0000", resume=True)


# -- compare --------------------------------------------------------------------------------------
def _fake_run(path: Path, model: str, fingerprint: str, test: dict) -> Path:
    path.mkdir(parents=True)
    rundir.write_config(
        path,
        model,
        {},
        {"seed": 1},
        {
            "path": f"/data/{fingerprint}",
            "fingerprint": fingerprint,
            "n_items": 10,
            "n_train_users": 10,
        },
        "0.1.0",
    )
    (path / "results.json").write_text(
        json.dumps({"best_epoch": 1, "validation": {}, "test": test})
    )
    return path


def test_compare_run_dirs_paired_t_test(tmp_path, capsys):
    a = [0.30, 0.28, 0.33, 0.31]
    b = [0.32, 0.31, 0.33, 0.35]
    specs = []
    for i, (x, y) in enumerate(zip(a, b)):
        m = {"ndcg@100": x, "recall@20": x / 2, "recall@50": x * 1.5}
        n = {"ndcg@100": y, "recall@20": y / 2 + 0.01 * i, "recall@50": y * 1.5}
        specs.append(str(_fake_run(tmp_path / f"a{i}", "multvae", f"fp{i}", m)))
        specs.append("B=" + str(_fake_run(tmp_path / f"b{i}", "ease", f"fp{i}", n)))
    # a run on a split only one model has is left out
    specs.append(
        str(
            _fake_run(
                tmp_path / "a9",
                "multvae",
                "fp9",
                {"ndcg@100": 0.9, "recall@20": 0.1, "recall@50": 0.1},
            )
        )
    )
    assert cli("compare", *specs, "--out", tmp_path / "cmp", "--json") == 0
    s = json.loads(capsys.readouterr().out)
    assert s["labels"] == ["multvae", "B"] and s["n_splits"] == 4
    assert len(s["dropped_splits"]) == 1
    rows = {(r["label"], r["metric"]): r for r in s["summary"]}
    ref = stats.ttest_rel(b, a)
    r = rows[("B", "ndcg@100")]
    assert r["p"] == pytest.approx(ref.pvalue) and r["t"] == pytest.approx(ref.statistic)
    assert r["diff_mean"] == pytest.approx(np.mean(np.subtract(b, a)))
    assert rows[("multvae", "ndcg@100")]["mean"] == pytest.approx(np.mean(a))
    assert rows[("multvae", "ndcg@100")]["sd"] == pytest.approx(np.std(a, ddof=1))
    assert rows[("multvae", "ndcg@100")]["p"] is None
    ref20 = stats.ttest_rel([y / 2 + 0.01 * i for i, y in enumerate(b)], [x / 2 for x in a])
    assert rows[("B", "recall@20")]["p"] == pytest.approx(ref20.pvalue)
    for f in ("compare_splits.csv", "compare_summary.csv", "compare.json", "compare.png"):
        assert (tmp_path / "cmp" / f).stat().st_size > 100
    assert (tmp_path / "cmp" / "compare_splits.csv").read_text().count("\n") == 9
    assert cli("compare", *specs[:2], "--out", tmp_path / "cmp2") == 0
    text = capsys.readouterr().out
    assert "0.3000 ±      -" in text and "   n/a" in text  # one split: no sd, no test


def test_compare_trains_and_resumes(tmp_path, capsys):
    df = synthetic.generate(n_users=400, n_items=120, n_groups=4, mean_items=12, seed=5)
    raw = tmp_path / "raw.csv"
    df.write_csv(raw)
    cfg = tmp_path / "e10.toml"
    cfg.write_text('[model]\nname = "ease"\nl2 = 10.0\n')
    args = [
        "compare",
        "--data",
        raw,
        "--user-col",
        "user_id",
        "--item-col",
        "item_id",
        "--heldout-users",
        "40",
        "--models",
        f"ease,popular,e10={cfg}",
        "--seeds",
        "1,2",
        "--out",
        tmp_path / "c",
        "--device",
        "cpu",
    ]
    assert cli(*args) == 0
    first = capsys.readouterr()
    assert "e10" in first.out and "wrote" in first.out
    run = tmp_path / "c" / "runs" / "e10" / "seed-2"
    assert rundir.load_config(run)["model"]["config"]["l2"] == 10.0
    assert rundir.load_config(run)["train"]["seed"] == 2
    kept = tmp_path / "c" / "runs" / "ease" / "seed-1" / "results.json"
    stamp = kept.stat().st_mtime_ns
    (run / "results.json").unlink()  # as if stopped before its end
    assert cli(*args) == 0
    log = capsys.readouterr().err
    assert log.count("reused") == 5 and "seed 2  e10: resumed" in log
    assert kept.stat().st_mtime_ns == stamp
    s = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert s["splits"] == ["seed 1", "seed 2"] and s["labels"] == ["ease", "popular", "e10"]


# -- plots and TensorBoard ------------------------------------------------------------------------
def _png_ok(path: Path):
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.shape[0] > 300 and img.shape[1] > 600
    assert img[..., :3].std() > 0.05  # not blank


def test_plot_one_and_several_runs(runs, tmp_path, capsys):
    assert cli("plot", runs["multvae"], "--out", tmp_path / "one.png") == 0
    assert cli("plot", runs["multvae"], f"EASE={runs['ease']}", "--out", tmp_path / "two.png") == 0
    _png_ok(tmp_path / "one.png")
    _png_ok(tmp_path / "two.png")
    assert cli("plot", tmp_path, "--out", tmp_path / "x.png") == 2
    capsys.readouterr()
    assert cli("plot", runs["multvae"], "--out", tmp_path / "no" / "dir" / "x.png") == 2
    assert "no/dir does not exist" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_tensorboard_missing_says_how_to_install(tiny, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    assert (
        cli(
            "train", "--data", tiny.path, "--out", tmp_path / "tb", "--tensorboard", "--epochs", "1"
        )
        == 2
    )
    assert "pip install 'vaecf[tensorboard]'" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists()


def test_tensorboard_scalars(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert (
        cli(
            "train",
            "--data",
            tiny.path,
            "--out",
            tmp_path / "tb",
            "--tensorboard",
            "--epochs",
            "2",
            "--batch-size",
            "100",
            "--hidden-dims",
            "40",
            "--latent-dim",
            "20",
            "--quiet",
        )
        == 0
    )
    ea = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    ea.Reload()
    got = [(e.step, e.value) for e in ea.Scalars("validation/ndcg@100")]
    want = [(r["epoch"], r["validation"]["ndcg@100"]) for r in rundir.read_metrics(tmp_path / "tb")]
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


def test_compare_on_a_prepared_directory_and_a_headerless_file(tmp_path, capsys):
    df = synthetic.generate(n_users=300, n_items=80, n_groups=4, mean_items=12, seed=6)
    raw = tmp_path / "raw.txt"  # no header, fields split by runs of blanks, CRLF endings
    raw.write_bytes(
        b"".join(f"{u}  {i}\t1\r\n".encode() for u, i in df.select("user_id", "item_id").rows())
    )
    common = ["--models", "ease,popular", "--seeds", "1,2", "--device", "cpu"]
    args = ["--no-header", "--columns", "user,item,rating", "--sep", "whitespace"]
    assert cli("compare", "--data", raw, *args, "--heldout-users", 30, "--out", tmp_path / "a",
               *common) == 0  # fmt: skip
    prepared = tmp_path / "a" / "data" / "seed-1"
    assert cli("compare", "--data", prepared, "--out", tmp_path / "b", *common) == 0
    err = capsys.readouterr().err
    assert "is a prepared dataset: every seed uses its one split" in err
    s = json.loads((tmp_path / "b" / "compare.json").read_text())
    assert s["splits"] == ["seed 1", "seed 2"] and s["labels"] == ["ease", "popular"]
    for seed in (1, 2):  # the same split each time: the seeds vary the training only
        cfg = rundir.load_config(tmp_path / "b" / "runs" / "ease" / f"seed-{seed}")
        assert Path(cfg["data"]["path"]) == prepared
    # the same split as the first compare's seed 1: the same deterministic EASE, the same test
    a_res = rundir.load_results(tmp_path / "a" / "runs" / "ease" / "seed-1")
    b_res = rundir.load_results(tmp_path / "b" / "runs" / "ease" / "seed-2")
    assert a_res["test"] == pytest.approx(b_res["test"])
    # a prepared directory holds its own split
    assert cli("compare", "--data", prepared, "--heldout-users", 30, "--out", tmp_path / "c",
               *common) == 2  # fmt: skip
    assert "holds its own split; drop --heldout-users" in capsys.readouterr().err
