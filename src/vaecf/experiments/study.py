"""A `vaecf tune` study directory: its Optuna storage, its lock, the recovery of trials a killed
process left behind, and its report (the trials' table, CSV and the best run's test score).

    STUDY/study.db       the Optuna study (SQLite): every trial, its parameters, its per-epoch
                         validation values and its state; the study's own settings as user attrs
    STUDY/trials/NNNN    trial NNNN: an ordinary run directory (`vaecf train` layout)
    STUDY/.lock          held (flock) while a tune or compare runs on the directory
"""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Callable
from pathlib import Path

from vaecf import rundir
from vaecf.errors import RunError, VaecfError, WriteError
from vaecf.experiments.space import require_optuna
from vaecf.storage.safewrite import atomic_file, disk_full_in, write_json

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


def trial_dir(study_dir: Path, number: int) -> Path:
    return Path(study_dir) / TRIALS / f"{number:04d}"


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
def no_space_to_resume(study_dir: Path):
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


def counts(trials) -> int:
    """Trials that count towards --trials: finished, not interrupted."""
    from optuna.trial import TrialState

    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(t.state in done and "interrupted" not in t.user_attrs for t in trials)


def recover(study, storage, log, complete: Callable[[dict], bool]) -> None:
    """Mark trials a killed process left RUNNING as failed (interrupted), and queue every
    interrupted trial's parameters once more (its run directory is continued). A trial killed
    before it had drawn all its parameters (`complete(params)` false) has nothing to repeat:
    it is not queued again (a queued trial would draw the missing ones afresh under the old
    one's name); a new trial takes its place. A retry itself killed before it had drawn its
    queued parameters does not count as the retry: the original's are queued again."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    for t in trials:
        if t.state == TrialState.RUNNING:  # we hold the lock: its process is gone
            storage.set_trial_user_attr(t._trial_id, "interrupted", "killed")
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            log(f"trial {t.number} was left running by a stopped tune: marked failed")
    trials = study.get_trials(deepcopy=False)
    retried = {
        t.user_attrs.get("retry_of")
        for t in trials
        if t.params or not (t.state == TrialState.FAIL and "interrupted" in t.user_attrs)
    }
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


def open_study(study_dir: Path, resume: bool, info: dict, seed: int | None):
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


def fmt_value(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_table(rows: list[dict], metric: str = METRIC) -> str:
    """The trials as a text table (validation values of `metric`, the study's, only)."""
    if not rows:
        return "(no trials)"
    params = sorted({k for r in rows for k in r if k.startswith("param:")})
    head = ["trial", "state", f"val {metric}", "best epoch", "epochs run", "seconds"]
    head += [p[6:] for p in params]
    body = [
        [
            str(r["trial"]),
            r["state"],
            fmt_value(r["value"] if r["value"] is not None else r["best_so_far"]),
            fmt_value(r["best_epoch"]),
            fmt_value(r["epochs_run"]),
            fmt_value(r["seconds"]),
            *(fmt_value(r.get(p)) for p in params),
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


def write_csv(path: Path, rows: list[dict]) -> None:
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
