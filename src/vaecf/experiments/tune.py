"""Hyper-parameter search (`vaecf tune`) on Optuna: what a study directory holds and how a study
runs, stops and resumes.

    STUDY/study.db       the Optuna study (SQLite): every trial, its parameters, its per-epoch
                         validation values and its state; the study's own settings as user attrs
    STUDY/trials/NNNN    trial NNNN: an ordinary run directory (`vaecf train` layout), trained with
                         the test split left unscored
    STUDY/trials.csv     one row per trial: state, validation value, best epoch, parameters
    STUDY/best.toml      the best trial's settings, for `vaecf train --config`
    STUDY/best.json      the best trial: parameters, validation metrics and its test metrics
    STUDY/history.png    validation value per trial, the best so far
    STUDY/importance.png parameter importances (Optuna's default evaluator)

Search: the model's `search_space(trial, n_train_users)` (vaecf.models), a seeded TPE sampler and
a median pruner fed the best validation value so far after every validated epoch (from the 6th
trial and the 20th epoch on). Selection sees
validation only; the test split is scored once, for the best trial, when the study ends.

Stopping and resuming: a lock file keeps a second tune off the study. A trial that is stopped by
--timeout or Ctrl-C, or left RUNNING by a killed process, is marked failed and flagged
"interrupted"; `--resume` queues its parameters again once, and the new trial continues the old
trial's run directory from its last checkpoint (renamed to the new trial's number). Finished
trials (complete, pruned, diverged) stay exactly as they are; --trials counts them, so a resumed
study runs only what is missing.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vaecf import models, rundir
from vaecf.config import toml as configfile
from vaecf.errors import ConfigError, RunError
from vaecf.experiments.space import (
    SpaceFn,
    check_fixed,
    default_space,
    drew_all,
    require_optuna,
    settings_of,
    trial_settings,
)
from vaecf.experiments.study import (
    LOCK,
    METRIC,
    STUDY_DB,
    counts,
    fmt_value,
    locked,
    no_space_to_resume,
    open_study,
    recover,
    score_test,
    trial_dir,
    trial_rows,
    write_csv,
)
from vaecf.storage.safewrite import write_json


class _Stopped(Exception):
    """--timeout reached inside a trial: it stops at the end of its epoch, to be resumed."""


@dataclass
class TuneResult:
    study_dir: Path
    n_trials: int
    best_trial: int | None = None
    best_value: float | None = None
    best_run: Path | None = None
    validation: dict = field(default_factory=dict)
    test: dict | None = None
    rows: list[dict] = field(default_factory=list)
    files: dict = field(default_factory=dict)
    metric: str = METRIC  # what the trials were judged by (--select-metric)


def tune(
    data,
    out: str | os.PathLike,
    model: str = "multvae",
    trials: int = 20,
    timeout: float | None = None,
    seed: int | None = None,
    resume: bool = False,
    base: configfile.RunSettings | None = None,
    space: SpaceFn | None = None,
    log: Callable[[str], None] = print,
    plots: bool = True,
    fixed: dict | None = None,
) -> TuneResult:
    """Run (or resume) a study of `model` on prepared dataset `data` into `out` until it holds
    `trials` finished trials or `timeout` seconds have passed; then score the best trial's test
    split once and write the table, best.toml, best.json and the pictures. `fixed` holds
    search-space parameters at given values (not searched)."""
    from vaecf.data.prepare import PreparedDataset

    optuna = require_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study_dir = Path(out)
    _check_study(study_dir, trials, timeout, resume)
    base = base or configfile.RunSettings()
    models.get(model)
    space = space or default_space(model)
    ds = data if isinstance(data, PreparedDataset) else PreparedDataset(data)
    check_fixed(space, fixed or {}, ds.manifest["counts"]["n_train_users"])
    study_dir.mkdir(parents=True, exist_ok=True)
    metric = base.train.get("select_metric") or METRIC
    with locked(study_dir), no_space_to_resume(study_dir):
        info = {
            "model": model,
            "data": str(ds.path.resolve()),
            "fingerprint": ds.fingerprint,
            "metric": metric,
            "base": {"train": base.train, "model": base.model_config},
            "fixed": dict(fixed or {}),
        }
        study, storage, saved = open_study(study_dir, resume, info, seed)
        if resume:
            base = _resumed_base(study_dir, base, fixed, saved)
        fixed = saved.get("fixed", {})
        n_train = ds.manifest["counts"]["n_train_users"]
        check_fixed(space, fixed, n_train)
        recover(study, storage, log, lambda p: drew_all(space, p, fixed, n_train))
        deadline = time.monotonic() + timeout if timeout else None
        metric = saved.get("metric", METRIC)  # a resumed study's own
        base.train["select_metric"] = metric
        objective = _Objective(
            study_dir, ds, model, space, base, saved["seed"], deadline, fixed, log
        )
        while counts(study.get_trials(deepcopy=False)) < trials:
            if deadline is not None and time.monotonic() >= deadline:
                log(f"--timeout {timeout:g} s reached")
                break
            _run_one(study, objective, log)
        return finish(study_dir, study, model, space, base, saved["seed"], ds, log, plots, fixed)


def _check_study(study_dir: Path, trials: int, timeout: float | None, resume: bool) -> None:
    """A study's bounds and, on a resume, its directory, checked before any work."""
    if trials < 1:
        raise ConfigError("--trials must be at least 1")
    if timeout is not None and timeout <= 0:
        raise ConfigError("--timeout must be positive (seconds)")
    if resume and not (study_dir / STUDY_DB).is_file() and study_dir.exists():
        if any(p.name != LOCK for p in study_dir.iterdir()):
            raise RunError(f"{study_dir} holds no study ({STUDY_DB}) to resume")


def _resumed_base(study_dir: Path, base, fixed: dict | None, saved: dict):
    """The study's own base settings (`saved`): a resume may move it to another device, and
    refuses other --config settings or other --fix values."""
    given = {k: v for k, v in base.train.items() if k != "device"}
    saved_train = {k: v for k, v in saved["base"]["train"].items() if k != "device"}
    if (given and given != saved_train) or (
        base.model_config and base.model_config != saved["base"]["model"]
    ):
        raise RunError(
            f"{study_dir} keeps the --config settings it was started with; drop --config"
        )
    if fixed and fixed != saved.get("fixed", {}):
        raise RunError(f"{study_dir} was started with other --fix values; drop --fix")
    device = base.train.get("device", saved["base"]["train"].get("device"))
    train_base = {**saved["base"]["train"]}
    if device is not None:
        train_base["device"] = device
    return configfile.RunSettings(train=train_base, model_config=saved["base"]["model"])


class _Objective:
    def __init__(self, study_dir, ds, model, space, base, seed, deadline, fixed, log=print):
        self.study_dir, self.ds, self.model, self.space, self.log = study_dir, ds, model, space, log
        self.base, self.seed, self.deadline, self.fixed = base, seed, deadline, fixed
        self.metric = base.train["select_metric"]  # what a trial is judged by (tune sets it)

    def __call__(self, trial) -> float:
        import optuna

        from vaecf.config.train import TrainConfig
        from vaecf.training import train

        n_train = self.ds.manifest["counts"]["n_train_users"]
        train_d, model_d = trial_settings(
            self.space, trial, n_train, self.base, self.seed, self.fixed
        )
        run = trial_dir(self.study_dir, trial.number)
        trial.set_user_attr("run_dir", str(run.relative_to(self.study_dir)))
        resume = False
        retry = trial.user_attrs.get("retry_of")
        if retry is not None:
            old = trial_dir(self.study_dir, retry)
            if rundir.is_run(old) and (
                (old / rundir.LAST).is_file() or (old / rundir.RESULTS).is_file()
            ):
                os.replace(old, run)
                resume = True
            elif old.exists():  # killed before its first checkpoint: start it again
                shutil.rmtree(old)
        if run.exists() and not resume:
            shutil.rmtree(run)  # a leftover of an earlier, lost study of the same number
        shown = ", ".join(f"{k}={fmt_value(v)}" for k, v in sorted(trial.params.items()))
        how = f" (continues trial {retry})" if resume else ""
        self.log(f"trial {trial.number:4d}  started{how}: {shown or 'no parameters'}")
        cfg = TrainConfig(**{**train_d, "progress": False})
        mcfg = models.config_from_dict(self.model, model_d)
        state = {"best": -math.inf}

        def report(row: dict) -> None:
            value = (row.get("validation") or {}).get(self.metric)
            if value is None:
                return
            state["best"] = max(state["best"], value)
            trial.report(state["best"], int(row["epoch"]))
            if trial.should_prune():
                raise optuna.TrialPruned(
                    f"epoch {row['epoch']}: best {self.metric} {state['best']:.4f} is below the "
                    "median"
                )
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise _Stopped(f"--timeout reached at epoch {row['epoch']}")

        if resume:  # the epochs the interrupted trial checkpointed, as if this one had run them
            upto = _checkpointed_epoch(run)
            for row in rundir.read_metrics(run):
                if row["epoch"] <= upto:
                    report(row)
        res = train(
            self.ds, cfg, run, mcfg, resume=resume, model=self.model, on_epoch=report, test=False
        )
        trial.set_user_attr("best_epoch", res.best_epoch)
        trial.set_user_attr("validation", _plain(res.validation_metrics))
        return float(res.validation_metrics[self.metric])


def _checkpointed_epoch(run: Path) -> float:
    """The last epoch a run can continue from: all of them when it finished, else last.pt's
    (metrics.jsonl may hold later epochs, which the trainer drops and trains again)."""
    from vaecf.storage import checkpoint

    if (run / rundir.RESULTS).is_file():
        return math.inf
    if not (run / rundir.LAST).is_file():
        return 0
    return int(checkpoint.load(run / rundir.LAST, map_location="cpu")["epoch"])


def _plain(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items()}


def _run_one(study, objective: _Objective, log) -> None:
    import optuna
    from optuna.trial import TrialState

    from vaecf.training.single import TrainingDiverged

    trial = study.ask()
    t0 = time.monotonic()
    try:
        value = objective(trial)
    except optuna.TrialPruned as e:
        study.tell(trial, state=TrialState.PRUNED)
        _drop_last(objective, trial)
        log(f"trial {trial.number:4d}  pruned ({e})  {time.monotonic() - t0:.0f} s")
    except _Stopped as e:
        trial.set_user_attr("interrupted", "timeout")
        study.tell(trial, state=TrialState.FAIL)
        log(f"trial {trial.number:4d}  stopped: {e}; `vaecf tune --resume` continues it")
    except KeyboardInterrupt:
        trial.set_user_attr("interrupted", "ctrl-c")
        study.tell(trial, state=TrialState.FAIL)
        raise
    except TrainingDiverged as e:
        trial.set_user_attr("error", str(e).split(";")[0])
        study.tell(trial, state=TrialState.FAIL)
        log(f"trial {trial.number:4d}  failed: {e}")
    except BaseException as e:
        if _caused_by_interrupt(e):  # Ctrl-C landed inside a library, which raised its own
            trial.set_user_attr("interrupted", "ctrl-c")
            study.tell(trial, state=TrialState.FAIL)
            raise KeyboardInterrupt from e
        trial.set_user_attr("error", f"{type(e).__name__}: {e}")
        study.tell(trial, state=TrialState.FAIL)
        raise
    else:
        study.tell(trial, value)
        _drop_last(objective, trial)
        best = study.best_trial
        log(
            f"trial {trial.number:4d}  {objective.metric} {value:.4f}  "
            f"(best {best.value:.4f}, trial {best.number})  {time.monotonic() - t0:.0f} s"
        )


def _caused_by_interrupt(e: BaseException | None) -> bool:
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, KeyboardInterrupt):
            return True
        e, seen = e.__context__ or e.__cause__, seen + 1
    return False


def _drop_last(objective: _Objective, trial) -> None:
    """A finished trial will not be trained further: drop its resume checkpoint (last.pt: the
    weights and optimizer state, the bulk of the disk a study takes)."""
    last = trial_dir(objective.study_dir, trial.number) / rundir.LAST
    with contextlib.suppress(FileNotFoundError):
        last.unlink()


def finish(
    study_dir, study, model, space, base, seed, ds, log, plots=True, fixed=None
) -> TuneResult:
    """Table, CSV, best settings and test score, pictures: from the study as it stands."""
    from optuna.trial import TrialState

    metric = base.train["select_metric"]  # the study's (tune sets it)
    rows = trial_rows(study)
    res = TuneResult(study_dir, len(rows), rows=rows, metric=metric)
    write_csv(study_dir / "trials.csv", rows)
    res.files["table"] = study_dir / "trials.csv"
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if plots:
        from vaecf.experiments.plots import plot_study

        res.files.update(plot_study(study, study_dir, metric, log))
    if not complete:
        log("no trial has finished yet: no best settings (run more trials: --resume)")
        return res
    best = study.best_trial
    run = study_dir / best.user_attrs["run_dir"]
    n_train = ds.manifest["counts"]["n_train_users"]
    train_d, model_d = settings_of(space, best.params, n_train, base, seed, fixed)
    configfile.write(
        study_dir / "best.toml",
        model,
        train_d,
        model_d,
        data=str(ds.path.resolve()),
        header=(
            f"vaecf tune: the best of {len(complete)} complete trials of {model} "
            f"(trial {best.number}, validation {metric} {best.value:.4f}).\n"
            "Train with it: vaecf train --config best.toml --out RUN [--data OTHER]"
        ),
    )
    test = score_test(run, ds)
    res.best_trial, res.best_value, res.best_run = best.number, best.value, run
    res.validation, res.test = best.user_attrs.get("validation", {}), test
    write_json(
        study_dir / "best.json",
        {
            "trial": best.number,
            "params": best.params,
            "train": train_d,
            "model": {"name": model, "config": model_d},
            "run_dir": str(run),
            "validation": res.validation,
            "test": test,
            "complete_trials": len(complete),
        },
    )
    res.files["best_toml"] = study_dir / "best.toml"
    res.files["best_json"] = study_dir / "best.json"
    return res
