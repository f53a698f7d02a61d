"""Experiment verbs: tune (hyper-parameter search), compare (models over split seeds), plot
(training curves). The work is in vaecf.experiments; this module parses and prints."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from vaecf.cli.common import metrics_table, print_json
from vaecf.cli.options import add_columns_options, add_settings, from_args
from vaecf.config.settings import Compute, ModelChoice, flag, setting


@dataclass
class TuneSettings(ModelChoice):
    trials: int = setting(20, "finished trials the study should hold (a resume runs the rest)")


@dataclass
class CompareSettings:
    seeds: str = setting("98765,1,2,3,4", "split seeds, comma-separated")


# -- tune ---------------------------------------------------------------------------------------
def cmd_tune(a) -> int:
    from vaecf.config import toml as configfile
    from vaecf.config.train import TrainConfig
    from vaecf.experiments import space, study, tune

    s = from_args(TuneSettings, a)
    base = configfile.read(a.config) if a.config else None
    if base is not None and base.model not in (None, s.model):
        from vaecf.errors import ConfigError

        raise ConfigError(f"{a.config} configures {base.model}, not --model {s.model}")
    given = {k: v for k, v in (("device", a.device), ("select_metric", a.select_metric)) if v}
    if given:
        base = base or configfile.RunSettings()
        base.train.update(given)
        TrainConfig(**base.train).validate()  # a bad metric: one line before any work
    log = (lambda s: print(s, file=sys.stderr)) if a.json else print
    res = tune.tune(
        a.data,
        a.out,
        model=s.model,
        trials=s.trials,
        timeout=a.timeout,
        seed=a.seed,
        resume=a.resume,
        base=base,
        log=log,
        fixed=space.parse_fixed(a.fix),
    )
    if a.json:
        print_json(
            {
                "study_dir": str(res.study_dir),
                "trials": res.rows,
                "best_trial": res.best_trial,
                "best_value": res.best_value,
                "best_run": str(res.best_run) if res.best_run else None,
                "validation": res.validation,
                "test": res.test,
                "files": {k: str(v) for k, v in res.files.items()},
            }
        )
        return 0
    print()
    print(study.format_table(res.rows, res.metric))
    if res.best_trial is not None:
        print(
            f"\nbest: trial {res.best_trial} ({res.best_run}); settings in {res.files['best_toml']}"
        )
        keys = ("recall@20", "recall@50", "ndcg@100", res.metric)
        print(metrics_table({"validation": res.validation, "test (once)": res.test}, keys))
    for key in ("table", "history_png", "importance_png", "best_json"):
        if key in res.files:
            print(f"wrote {res.files[key]}")
    return 0


# -- compare ------------------------------------------------------------------------------------
def cmd_compare(a) -> int:
    from vaecf.errors import ConfigError
    from vaecf.experiments import compare
    from vaecf.experiments.rescore import rescore
    from vaecf.run_evaluation import parse_metrics

    if a.data and a.runs:
        raise ConfigError("pass either --data (train every model) or run directories, not both")
    if a.data:
        prepare = _compare_prepare(a)
        if not a.models:
            raise ConfigError("--data needs --models (registry names or LABEL=FILE.toml)")
        entries = compare.parse_models(a.models)
        records = compare.train_all(
            a.data,
            a.out,
            entries,
            compare.parse_seeds(from_args(CompareSettings, a).seeds),
            prepare,
            epochs=a.epochs,
            device=a.device,
            log=(lambda s: print(s, file=sys.stderr)),
        )
    elif a.runs:
        if a.models or a.epochs:
            raise ConfigError("--models and --epochs apply with --data, not to finished runs")
        records = compare.read_runs(a.runs)
    else:
        raise ConfigError("pass run directories, or --data CSV with --models and --seeds")
    keys = compare.METRICS
    if a.metrics:  # every run scored again, by slice too
        keys = rescore(records, parse_metrics(a.metrics), a.device or "auto")
    s = compare.summarize(records, keys)
    files = compare.write_outputs(s, a.out, plot=not a.no_plot)
    if a.json:
        print_json({**s, "files": {k: str(v) for k, v in files.items()}})
        return 0
    print(compare.format_summary(s))
    for f in files.values():
        print(f"wrote {f}")
    return 0


def _compare_prepare(a) -> dict:
    """How `compare --data` prepares each seed's split: the flags for a raw file; nothing for
    a prepared dataset (it holds its own split; split flags beside it are refused)."""
    from vaecf.data.preprocess import file_protocol
    from vaecf.errors import ConfigError

    prepare = {
        "user_col": a.user_col,
        "item_col": a.item_col,
        "rating_col": a.rating_col,
        "sep": a.sep,
        "header": not a.no_header,
        "columns": a.columns,
        "min_rating": a.min_rating,
        "min_user_items": a.min_user_items,
        "heldout_users": a.heldout_users,
    }
    if a.min_user_items is None:
        del prepare["min_user_items"]  # PrepareSettings' default (5, as the paper)
    if (Path(a.data) / "manifest.json").is_file():  # prepared: its split and settings are its own
        given = [k for k, v in prepare.items() if v is not None and k != "header"]
        given += ["no_header"] if a.no_header else []
        if given:
            raise ConfigError(
                f"--data {a.data} is a prepared dataset, which holds its own split; drop "
                + ", ".join(map(flag, given))
                + " (or pass the raw file to prepare one split per seed)"
            )
        prepare = {}
    elif not a.models:
        raise ConfigError(
            "--data needs --models, and the columns as `vaecf prepare csv` takes them where "
            "they are not found by name (--user-col/--item-col, or --no-header --columns)"
        )
    else:
        del prepare["heldout_users"]
        prepare.update(file_protocol(a.heldout_users))
    return prepare


# -- plot ---------------------------------------------------------------------------------------
def cmd_plot(a) -> int:
    from vaecf.experiments.plots import plot_runs

    labels = None
    runs = []
    for spec in a.runs:
        label, sep, path = spec.rpartition("=")
        runs.append(path if sep else spec)
        if sep:
            labels = labels or {}
            labels[len(runs) - 1] = label
    names = None
    if labels:
        names = [labels.get(i, Path(r).name) for i, r in enumerate(runs)]
    out = plot_runs(runs, a.out, names)
    print(f"wrote {out}")
    return 0


def register(sub) -> None:
    _register_tune(sub)
    _register_compare(sub)
    _register_plot(sub)


def _register_tune(sub) -> None:
    from vaecf.config.specs import SPECS
    from vaecf.config.train import TrainConfig

    pt = sub.add_parser(
        "tune",
        help="search a model's hyper-parameters (Optuna: TPE, median pruning, SQLite study)",
        description="Search the hyper-parameters of --model on validation NDCG@100 (or "
        "--select-metric): seeded TPE "
        "sampling, a median pruner fed every validated epoch, the study stored in "
        "OUT/study.db and every trial a run directory OUT/trials/NNNN. At the end the best "
        "trial's test split is scored once, and OUT holds trials.csv, best.toml (for `vaecf "
        "train --config`), best.json, history.png and importance.png. A stopped tune "
        "(Ctrl-C, kill, --timeout) continues with --resume: finished trials are kept, "
        "interrupted ones continue from their checkpoints.",
    )
    pt.add_argument("--data", required=True, help="prepared dataset directory")
    pt.add_argument("--out", required=True, help="study directory to create (or resume)")
    add_settings(pt, TuneSettings)["model"].choices = [
        n for n, m in SPECS.items() if m.family != "selection"
    ]
    pt.add_argument(
        "--timeout",
        type=float,
        help="stop after this many seconds; the running trial stops at its next validated "
        "epoch and is continued by --resume",
    )
    pt.add_argument(
        "--seed",
        type=int,
        help="seed of the sampler and of training (unset: 0, or a resumed study's own)",
    )
    pt.add_argument("--resume", action="store_true", help="continue the study in --out")
    add_settings(pt, TrainConfig, only=("select_metric",))  # unset: the study's own, or ndcg@100
    pt.add_argument(
        "--config",
        metavar="FILE.toml",
        help="settings for what is not searched (device, precision, eval_every, ...); the "
        "search space overrides the settings it draws",
    )
    pt.add_argument(
        "--fix",
        action="append",
        metavar="NAME=VALUE",
        help="hold a search-space parameter at a value instead of searching it, e.g. "
        "--fix epochs=50 --fix hidden_dim=600 (repeatable; the names are listed when wrong)",
    )
    add_settings(pt, Compute, only=("device",))
    pt.add_argument("--json", action="store_true", help="print the result as JSON")
    pt.set_defaults(fn=cmd_tune)


def _register_compare(sub) -> None:
    pc = sub.add_parser(
        "compare",
        help="compare models over split seeds: mean ± sd, paired t-tests, CSV/JSON/PNG",
        description="Either train --models on a raw interactions file prepared once per seed "
        "(as `vaecf prepare csv`; the seed also seeds training; interrupted, it reuses finished "
        "runs and resumes the others), or read finished run directories (RUN or LABEL=RUN). "
        "Prints each model's test metrics as mean ± sd over the splits, and the paired "
        "difference to the first model with its paired t-test p-value.",
    )
    pc.add_argument("runs", nargs="*", help="finished run directories (RUN or LABEL=RUN)")
    pc.add_argument("--out", required=True, help="directory for the runs, tables and chart")
    pc.add_argument(
        "--data",
        help="raw interactions file (.csv, .tsv, .txt, .parquet; prepared once per seed), or a "
        "prepared dataset directory (its one split for every seed)",
    )
    pc.add_argument(
        "--models",
        help="comma-separated: registry names (multvae,recvae,ease,popular) or LABEL=FILE.toml "
        "(a best.toml or config.toml, e.g. tuned=STUDY/best.toml); the first is the reference",
    )
    add_settings(pc, CompareSettings)
    add_columns_options(pc)
    from vaecf.data.prepare import PrepareSettings

    add_settings(pc, PrepareSettings, only=("min_rating", "min_user_items", "heldout_users"))
    pc.add_argument("--epochs", type=int, help="override the epochs of the gradient models")
    add_settings(pc, Compute, only=("device",))
    pc.add_argument(
        "--metrics",
        metavar="LIST",
        help="score every run's test split with these (NAME@K,...: recall, ndcg, precision, "
        "map, mrr, hit, novelty, coverage, gini) and by history-length slice, each with its "
        "paired difference and p-value; default: the runs' own ndcg@100, recall@20, recall@50",
    )
    pc.add_argument("--no-plot", action="store_true", help="no compare.png")
    pc.add_argument("--json", action="store_true", help="print the summary as JSON")
    pc.set_defaults(fn=cmd_compare)


def _register_plot(sub) -> None:
    pp = sub.add_parser(
        "plot",
        help="training curves of runs: loss, NLL, KL, beta, validation metrics (PNG); a "
        "closed-form run's search",
        description="Draw the per-epoch training loss, NLL, KL and beta and the validation "
        "metrics of one or more runs, overlaid, each run's selected epoch marked; a closed-form "
        "run (EASE, EDLAE, inf-AE, popularity) among them is a level line at its validation "
        "metrics. Runs that are all closed-form have no training curve: their validation "
        "search is drawn instead (the metric over lambda, a line per p and beta, the choice "
        "starred). Where none of them searched (a fixed lambda, popularity) there is nothing "
        "to draw: one line says so, nothing is written, exit code 2.",
    )
    pp.add_argument("runs", nargs="+", help="run directories (RUN or LABEL=RUN)")
    pp.add_argument("--out", required=True, help="PNG file to write")
    pp.set_defaults(fn=cmd_plot)
