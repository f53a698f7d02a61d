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
import csv
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vaecf import configfile, models, rundir
from vaecf.errors import ConfigError, RunError, VaecfError, WriteError
from vaecf.safewrite import atomic_file, disk_full_in, write_json

STUDY_DB = "study.db"
TRIALS = "trials"
LOCK = ".lock"
STUDY_NAME = "vaecf"
METRIC = "ndcg@100"
# The median pruner judges a trial only after this many complete trials, and only from this
# epoch on: Mult-VAE's early epochs rank settings poorly (a smaller learning rate or a larger
# batch starts slower); 5 epochs pruned most trials of an ml-latest-small study at epoch 5.
PRUNE_AFTER_TRIALS = 5
PRUNE_AFTER_EPOCHS = 20

SpaceFn = Callable[[object, int], dict]


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


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("vaecf tune needs optuna: pip install optuna (or vaecf)") from None
    return optuna


def trial_dir(study_dir: Path, number: int) -> Path:
    return Path(study_dir) / TRIALS / f"{number:04d}"


def default_space(model: str) -> SpaceFn:
    """The model's declared search space; refuse models with nothing to tune."""
    cls = models.get(model)
    if cls.search_space.__func__ is models.Model.search_space.__func__:
        cls.search_space(None, 0)  # raises the model's ConfigError
    return cls.search_space


def settings_of(
    space: SpaceFn, params: dict, n_train_users: int, base, seed: int, fixed: dict | None = None
) -> tuple[dict, dict]:
    """(train, model) settings of a trial with parameters `params` (and the study's `fixed`
    ones): the base file's, then the space's, then the study's seed."""
    optuna = require_optuna()
    drawn = space(_Fixed(optuna.trial.FixedTrial(params), fixed or {}), n_train_users)
    return _merge(base, drawn, seed)


class _Fixed:
    """A trial whose `suggest_*` returns the study's fixed value for a fixed parameter (not
    searched, not recorded as a parameter) and asks the real trial otherwise."""

    def __init__(self, trial, fixed: dict):
        self._trial, self._fixed = trial, fixed

    def __getattr__(self, name: str):
        attr = getattr(self._trial, name)
        if not name.startswith("suggest_"):
            return attr

        def suggest(param: str, *args, **kwargs):
            if param in self._fixed:
                return self._fixed[param]
            return attr(param, *args, **kwargs)

        return suggest


def parse_fixed(items) -> dict:
    """`["epochs=40", "hidden_dim=0"]` -> {"epochs": 40, "hidden_dim": 0} (JSON values, else
    strings)."""
    out = {}
    for item in items or ():
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--fix takes NAME=VALUE (a search-space parameter), not {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out[name.strip()] = value
    return out


def check_fixed(space: SpaceFn, fixed: dict, n_train_users: int) -> None:
    """Refuse fixed names that are not parameters of the search space."""
    names: set[str] = set()

    class _Probe:
        def __getattr__(self, name):
            def suggest(param, *args, **kwargs):
                names.add(param)
                if name == "suggest_categorical":
                    return (args[0] if args else kwargs["choices"])[0]
                low = args[0] if args else kwargs["low"]
                return low

            return suggest

    space(_Probe(), n_train_users)
    wrong = sorted(set(fixed) - names)
    if wrong:
        raise ConfigError(
            f"--fix {', '.join(wrong)}: not a parameter of this search space; its parameters: "
            f"{', '.join(sorted(names))}"
        )


def _merge(base, drawn: dict, seed: int) -> tuple[dict, dict]:
    train = {**base.train, **drawn.get("train", {}), "seed": seed}
    return train, {**base.model_config, **drawn.get("model", {})}


@contextlib.contextmanager
def locked(study_dir: Path, verb: str = "tune"):
    """Hold `study_dir`/.lock (flock: released by the kernel even on SIGKILL) or refuse."""
    import fcntl

    f = open(study_dir / LOCK, "w")  # noqa: SIM115 (held for the whole study)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise RunError(
            f"another vaecf {verb} is running on {study_dir}; wait for it or stop it first"
        ) from None
    try:
        yield
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


@contextlib.contextmanager
def _no_space_to_resume(study_dir: Path):
    """A full disk (wrapped by Optuna's storage, SQLite or a writer) as a WriteError that says
    how to finish the study."""
    try:
        yield
    except VaecfError:
        raise
    except Exception as e:
        if not disk_full_in(e, study_dir):
            raise
        raise WriteError(
            f"no space left on the device holding {study_dir}; free some space and run the "
            "same `vaecf tune ... --resume` to finish the study (finished trials are kept; "
            "the interrupted one runs again)"
        ) from None


def _counts(trials) -> int:
    """Trials that count towards --trials: finished, not interrupted."""
    from optuna.trial import TrialState

    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(t.state in done and "interrupted" not in t.user_attrs for t in trials)


def _drew_all(space: SpaceFn, params: dict, fixed: dict, n_train_users: int) -> bool:
    """Whether `params` are a whole draw of the search space (it replays on them alone)."""
    try:
        settings_of(space, params, n_train_users, configfile.RunSettings(), 0, fixed)
    except (ValueError, KeyError):  # FixedTrial: a parameter the trial had not drawn yet
        return False
    return True


def _recover(study, storage, log, complete: Callable[[dict], bool]) -> None:
    """Mark trials a killed process left RUNNING as failed (interrupted), and queue every
    interrupted trial's parameters once more (its run directory is continued). A trial killed
    before it had drawn all its parameters (`complete(params)` false) has nothing to repeat:
    it is not queued again (a queued trial would draw the missing ones afresh under the old
    one's name); a new trial takes its place."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    for t in trials:
        if t.state == TrialState.RUNNING:  # we hold the lock: its process is gone
            storage.set_trial_user_attr(t._trial_id, "interrupted", "killed")
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            log(f"trial {t.number} was left running by a stopped tune: marked failed")
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    for t in trials:
        if (
            t.state == TrialState.FAIL
            and "interrupted" in t.user_attrs
            and t.params
            and complete(t.params)
            and t.number not in retried
        ):
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
            log(f"trial {t.number} ({t.user_attrs['interrupted']}) queued again")


def _open_study(study_dir: Path, resume: bool, info: dict, seed: int | None):
    optuna = require_optuna()
    db = study_dir / STUDY_DB
    exists = db.is_file()
    if exists and not resume:
        raise RunError(
            f"{study_dir} already holds a study; pass --resume to continue it or choose "
            "another --out"
        )
    if not exists and study_dir.exists() and any(p.name != LOCK for p in study_dir.iterdir()):
        raise RunError(f"{study_dir} exists and holds no study ({STUDY_DB}); choose another --out")
    storage = optuna.storages.RDBStorage(f"sqlite:///{db.resolve()}")
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=storage, direction="maximize", load_if_exists=True
    )
    saved = study.user_attrs.get("vaecf")
    if saved is None:
        info = {**info, "seed": 0 if seed is None else seed}
        study.set_user_attr("vaecf", info)
        saved = info
    else:
        for key, what in (("model", "--model"), ("fingerprint", "--data")):
            if saved[key] != info[key]:
                raise RunError(
                    f"{study_dir} tunes {saved['model']} on {saved['data']}; a resumed study "
                    f"cannot change {what}"
                )
        if seed is not None and seed != saved["seed"]:
            raise RunError(f"{study_dir} was started with --seed {saved['seed']}; drop --seed")
    n = len(study.trials)
    # seeded by the study's seed and its length: a resumed study draws new points, not the
    # first ones again, and the same history gives the same proposals
    study.sampler = optuna.samplers.TPESampler(seed=saved["seed"] + n)
    study.pruner = optuna.pruners.MedianPruner(
        n_startup_trials=PRUNE_AFTER_TRIALS, n_warmup_steps=PRUNE_AFTER_EPOCHS
    )
    return study, storage, saved


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
    if trials < 1:
        raise ConfigError("--trials must be at least 1")
    if timeout is not None and timeout <= 0:
        raise ConfigError("--timeout must be positive (seconds)")
    base = base or configfile.RunSettings()
    models.get(model)
    space = space or default_space(model)
    ds = data if isinstance(data, PreparedDataset) else PreparedDataset(data)
    check_fixed(space, fixed or {}, ds.manifest["counts"]["n_train_users"])
    study_dir = Path(out)
    if resume and not (study_dir / STUDY_DB).is_file() and study_dir.exists():
        if any(p.name != LOCK for p in study_dir.iterdir()):
            raise RunError(f"{study_dir} holds no study ({STUDY_DB}) to resume")
    study_dir.mkdir(parents=True, exist_ok=True)
    with locked(study_dir), _no_space_to_resume(study_dir):
        info = {
            "model": model,
            "data": str(ds.path.resolve()),
            "fingerprint": ds.fingerprint,
            "metric": METRIC,
            "base": {"train": base.train, "model": base.model_config},
            "fixed": dict(fixed or {}),
        }
        study, storage, saved = _open_study(study_dir, resume, info, seed)
        if resume:  # the study's own base settings (a resume may move it to another device)
            given = {k: v for k, v in base.train.items() if k != "device"}
            saved_train = {k: v for k, v in saved["base"]["train"].items() if k != "device"}
            if (given and given != saved_train) or (
                base.model_config and base.model_config != saved["base"]["model"]
            ):
                raise RunError(
                    f"{study_dir} keeps the --config settings it was started with; drop --config"
                )
            device = base.train.get("device", saved["base"]["train"].get("device"))
            train_base = {**saved["base"]["train"]}
            if device is not None:
                train_base["device"] = device
            base = configfile.RunSettings(train=train_base, model_config=saved["base"]["model"])
            if fixed and fixed != saved.get("fixed", {}):
                raise RunError(f"{study_dir} was started with other --fix values; drop --fix")
        fixed = saved.get("fixed", {})
        n_train = ds.manifest["counts"]["n_train_users"]
        check_fixed(space, fixed, n_train)
        _recover(study, storage, log, lambda p: _drew_all(space, p, fixed, n_train))
        deadline = time.monotonic() + timeout if timeout else None
        objective = _Objective(
            study_dir, ds, model, space, base, saved["seed"], deadline, fixed, log
        )
        while _counts(study.get_trials(deepcopy=False)) < trials:
            if deadline is not None and time.monotonic() >= deadline:
                log(f"--timeout {timeout:g} s reached")
                break
            _run_one(study, objective, log)
        return finish(study_dir, study, model, space, base, saved["seed"], ds, log, plots, fixed)


class _Objective:
    def __init__(self, study_dir, ds, model, space, base, seed, deadline, fixed, log=print):
        self.study_dir, self.ds, self.model, self.space, self.log = study_dir, ds, model, space, log
        self.base, self.seed, self.deadline, self.fixed = base, seed, deadline, fixed

    def __call__(self, trial) -> float:
        import optuna

        from vaecf.config import TrainConfig
        from vaecf.training import train

        n_train = self.ds.manifest["counts"]["n_train_users"]
        drawn = self.space(_Fixed(trial, self.fixed), n_train)
        train_d, model_d = _merge(self.base, drawn, self.seed)
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
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(trial.params.items()))
        how = f" (continues trial {retry})" if resume else ""
        self.log(f"trial {trial.number:4d}  started{how}: {shown or 'no parameters'}")
        cfg = TrainConfig(**{**train_d, "progress": False})
        mcfg = models.config_from_dict(self.model, model_d)
        state = {"best": -math.inf}

        def report(row: dict) -> None:
            value = (row.get("validation") or {}).get(METRIC)
            if value is None:
                return
            state["best"] = max(state["best"], value)
            trial.report(state["best"], int(row["epoch"]))
            if trial.should_prune():
                raise optuna.TrialPruned(
                    f"epoch {row['epoch']}: best {METRIC} {state['best']:.4f} is below the median"
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
        return float(res.validation_metrics[METRIC])


def _checkpointed_epoch(run: Path) -> float:
    """The last epoch a run can continue from: all of them when it finished, else last.pt's
    (metrics.jsonl may hold later epochs, which the trainer drops and trains again)."""
    from vaecf import checkpoint

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

    from vaecf.trainer import TrainingDiverged

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
            f"trial {trial.number:4d}  {METRIC} {value:.4f}  "
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


# -- the end of a study --------------------------------------------------------------------------
def trial_rows(study) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        dur = (t.datetime_complete - t.datetime_start).total_seconds() if t.duration else None
        inter = t.intermediate_values
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name.lower()
                + (f" ({t.user_attrs['interrupted']})" if "interrupted" in t.user_attrs else ""),
                "value": t.value,
                "best_so_far": max(inter.values()) if inter else None,
                "epochs_run": max(inter) if inter else None,
                "best_epoch": t.user_attrs.get("best_epoch"),
                "seconds": round(dur, 1) if dur is not None else None,
                "retry_of": t.user_attrs.get("retry_of"),
                "run_dir": t.user_attrs.get("run_dir"),
                **{f"param:{k}": v for k, v in sorted(t.params.items())},
            }
        )
    return rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_table(rows: list[dict]) -> str:
    """The trials as a text table (validation values only)."""
    if not rows:
        return "(no trials)"
    params = sorted({k for r in rows for k in r if k.startswith("param:")})
    head = ["trial", "state", f"val {METRIC}", "best epoch", "epochs run", "seconds"]
    head += [p[6:] for p in params]
    body = [
        [
            str(r["trial"]),
            r["state"],
            _fmt(r["value"] if r["value"] is not None else r["best_so_far"]),
            _fmt(r["best_epoch"]),
            _fmt(r["epochs_run"]),
            _fmt(r["seconds"]),
            *(_fmt(r.get(p)) for p in params),
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    note = (
        "pruned and stopped trials: the best value they reached; epochs run: the last "
        "validated epoch; seconds: this trial's own time (a continued trial's, since it resumed)"
    )
    return "\n".join(lines) + f"\n({note})"


def _write_csv(path: Path, rows: list[dict]) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with atomic_file(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def score_test(run: Path, ds) -> dict:
    """The test metrics of a run's selected model, written into its results.json."""
    from vaecf import precision as prec
    from vaecf.data.matrix import CSR
    from vaecf.evaluate import evaluate_model

    results = rundir.load_results(run)
    if results.get("test") is not None:
        return results["test"]
    device = prec.resolve_device(rundir.load_config(run)["train"].get("device", "auto"))
    model, cfg = rundir.load_model(run, device)
    test = evaluate_model(
        model,
        CSR.from_scipy(ds.split("test_tr"), device),
        CSR.from_scipy(ds.split("test_te"), device),
        precision=cfg["train"]["precision"],
    )
    write_json(run / rundir.RESULTS, {**results, "test": test})
    return test


def finish(
    study_dir, study, model, space, base, seed, ds, log, plots=True, fixed=None
) -> TuneResult:
    """Table, CSV, best settings and test score, pictures: from the study as it stands."""
    from optuna.trial import TrialState

    rows = trial_rows(study)
    res = TuneResult(study_dir, len(rows), rows=rows)
    _write_csv(study_dir / "trials.csv", rows)
    res.files["table"] = study_dir / "trials.csv"
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if plots:
        from vaecf.experiments.plots import plot_study

        res.files.update(plot_study(study, study_dir, METRIC, log))
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
            f"(trial {best.number}, validation {METRIC} {best.value:.4f}).\n"
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
