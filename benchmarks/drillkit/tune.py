"""The drill of `vaecf tune`: a study killed and resumed, and what a study directory holds
(`study_state`: its trials, read from a copy of study.db, and its files, checked against them).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .outputs import Broken, clear, file_digest, visible
from .runners import prepare_synthetic, run_ok, timed
from .training import run_state
from .trials import Drill


@dataclass(frozen=True)
class TrialRow:
    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    params: str  # JSON, sorted keys
    value: float | None
    retry_of: int | None
    interrupted: str | None
    started: bool  # it had drawn all its parameters

    @property
    def counted(self) -> bool:  # what --trials counts (study.counts)
        return self.state in ("COMPLETE", "PRUNED") or (
            self.state == "FAIL" and self.interrupted is None
        )


@dataclass(frozen=True)
class StudyState:
    trials: tuple[TrialRow, ...]  # () while study.db holds no study yet
    files: tuple  # (name, sha256 or None) of the study's own outputs
    best: tuple | None  # best.json's (trial, validation value, test metrics)


STUDY_FILES = ("trials.csv", "best.json", "best.toml", "history.png", "importance.png")


def _whole_draw(info: dict | None) -> Callable[[dict], bool]:
    """Whether a trial's parameters are a whole draw of the study's search space (the
    space replays on them, its fixed parameters added), from the study's own record."""
    if not info:
        return bool
    from vaecf import models
    from vaecf.data.prepare import PreparedDataset
    from vaecf.experiments.space import drew_all

    space = models.get(info["model"]).search_space
    n_train = PreparedDataset(info["data"]).manifest["counts"]["n_train_users"]
    return lambda params: bool(params) and drew_all(space, params, info.get("fixed", {}), n_train)


def study_state(study_dir: Path) -> StudyState | None:
    """What a `vaecf tune` study directory holds: None if nothing (or only the lock); else its
    trials (read from a copy of study.db and its journal, so that reading writes nothing into
    the study). Broken when a file under its final name is torn, a trial's run directory does
    not load, a complete trial's value is not its run's validation value, or trials.csv and
    best.json disagree with the study."""
    if not study_dir.exists() or not visible(study_dir):
        return None
    files = tuple((n, file_digest(study_dir / n)) for n in STUDY_FILES)
    db = study_dir / "study.db"
    trials: tuple[TrialRow, ...] = ()
    if db.exists():
        trials = _read_trials(study_dir, db)
    by_number = {t.number: t for t in trials}
    _check_trial_runs(study_dir, trials)
    best = _check_tables(study_dir, files, by_number)
    return StudyState(trials, files, best)


def _read_trials(study_dir: Path, db: Path) -> tuple[TrialRow, ...]:
    """The trials of study.db, read from a copy of it and its journal; Broken if unreadable."""
    import optuna

    with tempfile.TemporaryDirectory(prefix="vaecf-study-") as tmp:
        for p in study_dir.glob("study.db*"):  # the database and its journal, if any
            shutil.copyfile(p, Path(tmp) / p.name)
        storage = None
        try:
            storage = optuna.storages.RDBStorage(f"sqlite:///{Path(tmp) / 'study.db'}")
            study = optuna.load_study(study_name="vaecf", storage=storage)
            got = study.get_trials(deepcopy=False)
            whole = _whole_draw(study.user_attrs.get("vaecf"))
        except KeyError:  # killed before the study was created in it
            got, whole = [], bool
        except Exception as e:  # noqa: BLE001 - an unreadable database is a finding
            raise Broken(f"{db}: {type(e).__name__}: {e}") from None
        finally:
            if storage is not None:
                storage.engine.dispose()
    return tuple(
        TrialRow(
            t.number,
            t.state.name,
            json.dumps(t.params, sort_keys=True),
            t.value,
            t.user_attrs.get("retry_of"),
            t.user_attrs.get("interrupted"),
            whole(t.params),
        )
        for t in got
    )


def _check_trial_runs(study_dir: Path, trials: tuple[TrialRow, ...]) -> None:
    """Broken if a trial's run directory does not load, or a complete trial's value is not its
    run's validation value."""
    from vaecf.experiments.study import METRIC

    for t in trials:
        run = study_dir / "trials" / f"{t.number:04d}"
        if run.exists():
            run_state(run)  # raises Broken
        if t.state == "COMPLETE":
            try:
                res = json.loads((run / "results.json").read_text())
            except (OSError, ValueError) as e:
                raise Broken(f"complete trial {t.number}: {run}/results.json: {e}") from None
            if res["validation"][METRIC] != t.value:
                raise Broken(f"trial {t.number}: study value {t.value} != {run}/results.json")


def _check_tables(study_dir: Path, files: tuple, by_number: dict) -> tuple | None:
    """best.json's (trial, validation value, test metrics), None without it; Broken if
    trials.csv or best.json disagree with the study's trials (`by_number`)."""
    from vaecf.experiments.study import METRIC

    if dict(files)["trials.csv"]:
        import csv

        with open(study_dir / "trials.csv", newline="") as f:
            for row in csv.DictReader(f):
                t = by_number.get(int(row["trial"]))
                if t is None or (row["state"] == "complete" and float(row["value"]) != t.value):
                    raise Broken(f"trials.csv row {row['trial']} disagrees with study.db")
    best = None
    if dict(files)["best.json"]:
        b = json.loads((study_dir / "best.json").read_text())
        t = by_number.get(b["trial"])
        if t is None or t.state != "COMPLETE" or t.value != b["validation"][METRIC]:
            raise Broken(f"best.json names trial {b['trial']}, which study.db does not hold")
        best = (b["trial"], b["validation"][METRIC], json.dumps(b["test"], sort_keys=True))
    return best


class TuneDrill(Drill):
    """`vaecf tune` of Mult-VAE (a few epochs each, last.pt after every epoch) killed at random
    points and finished with `vaecf tune --resume`. Even trials start a study of `trials` trials;
    odd ones extend a finished study of `trials - 1` with `--resume --trials N`.

    A resumed study cannot reach the same trials as an uninterrupted one: its sampler is seeded
    by the study's seed and length (tune.py), and an interrupted trial is marked failed and
    queued again, which adds a trial. What must hold instead: after each kill, every file is
    whole and consistent with study.db (`study_state`) and no finished trial is lost or changed;
    after the finishing --resume exactly N trials count, none twice (distinct parameters), every
    interrupted trial that had drawn parameters was queued again exactly once with them (one
    killed before that, never), and every complete
    trial's value, and best.json's test metrics, equal those of training its parameters
    uninterrupted (`vaecf train` with tune's own settings: bit for bit on the CPU)."""

    name = "tune"

    def __init__(self, trials: int = 3, epochs: int = 4, n_users: int = 400, n_items: int = 100):
        self.n_trials, self.epochs, self.n_users, self.n_items = trials, epochs, n_users, n_items
        self.seen: dict[int, list] = {}
        self.retrained: dict[str, tuple] = {}  # params JSON -> (validation value, test)

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        self.root, self.runner = Path(root), runner
        self.data = prepare_synthetic(runner, self.root, self.n_users, self.n_items, 5, 40)[0]
        self.base = self.root / "inputs" / "base.toml"
        self.base.write_text('[train]\ncheckpoint_every = 0\nprecision = "fp32"\n')
        self.out = Path(out_parent or self.root / "studies") / "study"
        # the references run where the drill's output lives (best.json names its run by path)
        ref = self.root / "reference"
        ref.mkdir(parents=True, exist_ok=True)
        self.ref_old, self.ref_new = ref / "old", ref / "new"
        clear(self.out)
        run_ok(self.runner, self._argv(self.n_trials - 1))
        shutil.move(self.out, self.ref_old)
        t0 = time.perf_counter()
        run_ok(self.runner, self._argv(self.n_trials))
        self.duration = time.perf_counter() - t0
        shutil.move(self.out, self.ref_new)
        self.duration = min(self.duration, timed(runner, self._argv(self.n_trials), self.out))
        self.old_state, self.new_state = study_state(self.ref_old), study_state(self.ref_new)
        # the references are what training their parameters uninterrupted gives (if not, the
        # retraining below could not judge the drill's trials)
        for st in (self.old_state, self.new_state):
            why = self._values_match(st)
            if why:
                raise RuntimeError(f"tune is not reproducible by `vaecf train`: {why}")

    def _argv(self, trials: int, resume: bool = False) -> list:
        return [
            "tune", "--config", self.base, "--data", self.data, "--out", self.out,
            "--model", "multvae", "--trials", trials, "--seed", 0, "--device", "cpu",
            "--fix", f"epochs={self.epochs}", "--fix", "hidden_dim=0", "--fix", "latent_dim=8",
            "--fix", "batch_size=64", *(["--resume"] if resume else []),
        ]  # fmt: skip

    def reset(self, trial: int) -> None:
        clear(self.out)
        self.seen[trial] = []
        if trial % 2 == 1:
            shutil.copytree(self.ref_old, self.out)

    def command(self, trial: int) -> list:
        return self._argv(self.n_trials, resume=trial % 2 == 1)

    def finish_command(self, trial: int) -> list:
        return self._argv(self.n_trials, resume=True)

    def state(self):
        return study_state(self.out)

    def old(self, trial: int):
        return self.old_state if trial % 2 == 1 else None

    def final(self, trial: int):
        return self.new_state

    def allowed_after_kill(self, trial: int):
        def ok(st) -> bool:
            self.seen[trial].append(st)
            return self._lost(trial, st) is None

        return ok

    def output_paths(self) -> list[Path]:
        return [self.out]

    def _lost(self, trial: int, st) -> str | None:
        """A finished trial of an earlier state (the old study, a state seen after a kill) that
        `st` no longer holds as it was."""
        have = {t.number: t for t in (st.trials if st else ())}
        for before in [self.old(trial), *self.seen.get(trial, ())]:
            for t in before.trials if before else ():
                if t.counted and have.get(t.number) != t:
                    return f"finished trial {t.number} lost or changed: {have.get(t.number)}"
        return None

    def check_final(self, trial: int, st) -> str | None:
        if st is None or not st.trials or st.best is None:
            return f"no finished study: {st}"
        if any(d is None for _, d in st.files):
            return f"missing outputs: {st.files}"
        lost = self._lost(trial, st)
        if lost:
            return lost
        counted = [t for t in st.trials if t.counted]
        if len(counted) != self.n_trials:
            return f"{len(counted)} finished trials, not {self.n_trials}"
        if len({t.params for t in counted}) != len(counted):
            return "a finished trial was run twice (the same parameters)"
        retries = [t.retry_of for t in st.trials if t.retry_of is not None]
        if len(set(retries)) != len(retries):
            return f"an interrupted trial was queued again more than once: {retries}"
        params = {t.number: t.params for t in st.trials}
        for t in st.trials:
            # killed before all its parameters were drawn: nothing to continue, not queued again
            if t.interrupted and not t.started and t.number in retries:
                return f"trial {t.number}, killed before its parameters, was queued again"
            if t.interrupted and t.started and (t.number not in retries or not any(
                r.retry_of == t.number and r.params == t.params for r in st.trials
            )):  # fmt: skip
                return f"interrupted trial {t.number} was not run again with its parameters"
            if t.retry_of is not None and params.get(t.retry_of) != t.params:
                return f"trial {t.number} retries trial {t.retry_of} with other parameters"
        return self._values_match(st)

    def _values_match(self, st: StudyState) -> str | None:
        for t in st.trials:
            if t.state == "COMPLETE":
                value, test = self._retrain(t.params)
                if value != t.value:
                    return f"trial {t.number}: value {t.value}, retrained {value} ({t.params})"
                if st.best[0] == t.number and st.best[2] != test:
                    return f"best trial {t.number}: test {st.best[2]}, retrained {test}"
        return None

    def _retrain(self, params: str) -> tuple:
        """(validation value, test metrics JSON) of `vaecf train` with a trial's settings."""
        if params not in self.retrained:
            from vaecf import models
            from vaecf.config import toml as configfile
            from vaecf.data.prepare import PreparedDataset
            from vaecf.experiments.space import parse_fixed, settings_of
            from vaecf.experiments.study import METRIC

            fixed = parse_fixed(
                [f"epochs={self.epochs}", "hidden_dim=0", "latent_dim=8", "batch_size=64"]
            )
            base = configfile.read(self.base)
            base.train["device"] = "cpu"
            n_train = PreparedDataset(self.data).manifest["counts"]["n_train_users"]
            space = models.get("multvae").search_space
            train_d, model_d = settings_of(space, json.loads(params), n_train, base, 0, fixed)
            n = len(self.retrained)
            toml, out = self.root / "retrain" / f"{n}.toml", self.root / "retrain" / f"{n}"
            configfile.write(toml, "multvae", train_d, model_d, data=str(self.data))
            clear(out)
            run_ok(self.runner, ["train", "--config", toml, "--out", out, "--quiet"])
            res = json.loads((out / "results.json").read_text())
            test = json.dumps(res["test"], sort_keys=True)
            self.retrained[params] = (res["validation"][METRIC], test)
        return self.retrained[params]
