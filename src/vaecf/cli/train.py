"""Model verbs: train, evaluate, recommend."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from vaecf.cli.common import metrics_table, print_json
from vaecf.cli.options import add_settings, flag, from_args, given
from vaecf.config.settings import Compute, ModelChoice, ServingPrecision, setting
from vaecf.errors import VaecfError


# -- train --------------------------------------------------------------------------------------
def _model_settings() -> dict[str, list[str]]:
    """Model name -> the names of its config's settings (model-specific options)."""
    from vaecf.config.specs import SPECS

    return {
        name: [f.name for f in fields(spec.Config) if f.name != "model"]
        for name, spec in SPECS.items()
    }


def cmd_train(a) -> int:
    from vaecf.config import toml as configfile
    from vaecf.errors import ConfigError
    from vaecf.training import train

    file = configfile.read(a.config) if a.config else configfile.RunSettings()
    name = a.model or file.model or ModelChoice.model
    data = a.data or file.data
    if data is None:
        raise ConfigError('--data is required (or data = "PATH" in the --config file)')
    cfg, mcfg = _settings(a, file, name)
    on_epoch = None
    if a.tensorboard:
        from vaecf.experiments.tblog import TensorBoardLogger

        on_epoch = TensorBoardLogger(a.out)
    try:
        model_arg = a.model or file.model or (name if mcfg is not None else None)
        res = train(data, cfg, a.out, mcfg, resume=a.resume, model=model_arg, on_epoch=on_epoch)
    finally:
        if on_epoch is not None:
            on_epoch.close()
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun, rank 0 alone reports
    _report(res, a.json)
    return 0


def _settings(a, file, name: str):
    """(training config, model config or None where a resumed run keeps its own): the flags
    override the --config file, which overrides the defaults. A model flag of another model,
    or a resume asking other model settings than its run's, is refused."""
    from vaecf import models
    from vaecf.config.train import TrainConfig
    from vaecf.errors import ConfigError

    per_model = _model_settings()
    all_model = sorted({n for names in per_model.values() for n in names})
    wrong = [n for n in given(a, all_model) if n not in per_model[name]]
    if wrong:
        owners = {n: [m for m, names in per_model.items() if n in names] for n in wrong}
        raise VaecfError(
            "; ".join(f"{flag(n)} applies to --model {'/'.join(owners[n])}" for n in wrong)
            + f", not {name}"
        )
    train_given = {**file.train, **given(a, [f.name for f in fields(TrainConfig)])}
    try:
        cfg = TrainConfig(**train_given)
    except TypeError as e:
        raise ConfigError(f"bad training settings: {e}") from None
    cfg.progress = not a.quiet
    if not (a.resume and (Path(a.out) / "config.json").is_file()):
        return cfg, models.config_from_dict(
            name, {**file.model_config, **given(a, per_model[name])}
        )
    from vaecf.rundir import load_config

    saved = load_config(a.out)["model"]["config"]
    asked = {**file.model_config, **given(a, all_model)}  # the file's, then the flags
    clash = {k: v for k, v in asked.items() if saved.get(k) != v}
    if clash:
        raise VaecfError(
            "a resumed run keeps its model settings; "
            + ", ".join(f"{flag(k)} {v!r} (run: {saved.get(k)!r})" for k, v in clash.items())
            + " conflict; start a new --out to train with other settings"
        )
    return cfg, None


def _report(res, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "run_dir": str(res.run_dir),
                "best_epoch": res.best_epoch,
                "validation": res.validation_metrics,
                "test": res.test_metrics,
            }
        )
        return
    from vaecf import rundir

    ran = rundir.load_results(res.run_dir)
    epochs = "" if ran.get("steps", 0) == 0 else f"best epoch {res.best_epoch}; "
    print(f"\n{epochs}run directory {res.run_dir}")  # closed forms have no epochs
    keys = dict.fromkeys(("recall@20", "recall@50", "ndcg@100", *res.validation_metrics))
    keys = [k for k in keys if "@" in k]  # the defaults, then the metric it was chosen by
    print(metrics_table({"validation": res.validation_metrics, "test": res.test_metrics}, keys))


# -- models -------------------------------------------------------------------------------------
def cmd_models(a) -> int:
    from vaecf.config.specs import describe

    table = describe()
    if a.json:
        print_json(table)
        return 0
    for m in table:
        print(f"{m['name']:<9} {m['family']:<12} {m['summary']}")
        for st in m["settings"]:
            print(f"{'':<9} {flag(st['name'])} (default {st['default']!r})")
    return 0


# -- evaluate -----------------------------------------------------------------------------------
@dataclass
class EvaluateSettings(Compute):
    split: Literal["validation", "test"] = setting("test", "which held-out users")
    precision: ServingPrecision | None = setting(
        None,
        "score a serving copy in this precision (as `vaecf serve --precision`); unset: the run's "
        "training precision, which reproduces results.json",
    )


def cmd_evaluate(a) -> int:
    from vaecf.run_evaluation import (
        check_per_user_path,
        evaluate_run,
        parse_metrics,
        write_per_user,
    )

    s = from_args(EvaluateSettings, a)
    metrics = parse_metrics(a.metrics)  # checked before any work
    per_user = check_per_user_path(a.per_user) if a.per_user else None
    ev = evaluate_run(a.run, a.data, s.split, metrics, s.device, s.precision)
    if per_user is not None:
        write_per_user(ev.per_user, per_user)
    if a.json:
        print_json({"split": s.split, **ev.summary, "slices": ev.slices})
        return 0
    print(metrics_table({s.split: ev.summary}, metrics))
    n, skipped = ev.summary["n_users"], ev.summary["n_skipped"]
    print(f"{n} users evaluated, {skipped} skipped (empty target)")
    if ev.slices:
        print("\nby history length (items the user had):")
        print(metrics_table({f"{r['slice']} ({r['n_users']})": r for r in ev.slices}, metrics))
    if per_user is not None:
        print(f"per-user values: {per_user} ({ev.per_user.height} users)")
    return 0


# -- update -------------------------------------------------------------------------------------
def cmd_update(a) -> int:
    from vaecf.training.update import update

    s = from_args(Compute, a)
    res = update(a.run, a.data, a.out, a.budget, a.search, s.device, not a.json, a.patience)
    if a.json:
        print_json({"run_dir": str(res.run_dir), "validation": res.validation_metrics,
                    "test": res.test_metrics})  # fmt: skip
        return 0
    print(f"\nupdated run {res.run_dir} (from {a.run})")
    print(metrics_table({"validation": res.validation_metrics, "test": res.test_metrics}))
    return 0


def _register_update(sub) -> None:
    from vaecf.config.train import TrainConfig

    pu = sub.add_parser(
        "update",
        help="keep a run current: fit its model to a newer preparation of the same data",
        description="Fit RUN's model to --data (a newer preparation of the same source: more "
        "interactions, new users and items, the same ids) into the new run --out, never over "
        "RUN. EASE, EDLAE and inf-AE solve again at the settings RUN chose (--search: search "
        "again); Mult-VAE, Mult-DAE and RecVAE start from RUN's weights (new items at the mean "
        "of the old ones) and train with early stopping; popularity counts again.",
    )
    pu.add_argument("run", help="the run directory to keep current")
    pu.add_argument("--data", required=True, help="the newer prepared dataset")
    pu.add_argument("--out", required=True, help="the new run directory (must not exist)")
    pu.add_argument("--budget", type=float, help="seconds the update may take")
    pu.add_argument("--search", action="store_true", help="search a linear model's settings again")
    add_settings(pu, TrainConfig, only=("patience",))  # unset: 1 (the run's eval_every, where more)
    add_settings(pu, Compute, only=("device",))
    pu.add_argument("--json", action="store_true", help="print the new run's metrics as JSON")
    pu.set_defaults(fn=cmd_update)


def register(sub) -> None:
    _register_train(sub)
    _register_update(sub)
    _register_models(sub)
    _register_evaluate(sub)


def _register_train(sub) -> None:
    from vaecf.config.specs import SPECS
    from vaecf.config.train import TrainConfig

    pt = sub.add_parser(
        "train",
        help="train or fit a model ("
        + ", ".join(m.title for m in SPECS.values() if m.trainable)
        + ")",
        description="Train a model on a prepared dataset; gradient models validate every "
        "epoch, keep the best model by validation NDCG@100 and are resumable; EASE picks its "
        "lambda on validation. The test split is scored once, with the selected model. Unset "
        "settings are resolved from the model and the data and recorded in config.json.",
    )
    pt.add_argument(
        "--config",
        metavar="FILE.toml",
        help="settings file ([train] and [model] tables, as every run's config.toml); "
        "options given on the command line override it",
    )
    pt.add_argument("--data", help="prepared dataset directory (required unless --config sets it)")
    pt.add_argument("--out", required=True, help="run directory to create (or resume)")
    add_settings(pt, ModelChoice)["model"].choices = [n for n, m in SPECS.items() if m.trainable]
    add_settings(pt.add_argument_group("training"), TrainConfig, skip=("progress",))
    seen: dict = {}
    for name, cls in SPECS.items():
        if not cls.trainable:
            continue
        title = cls.title or name
        add_settings(
            pt.add_argument_group(f"{title} (--model {name})"),
            cls.Config,
            skip=("model",),
            note=f"{title}: ",
            seen=seen,
        )
    pt.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint (its own settings; "
        "--epochs may extend it)",
    )
    pt.add_argument("--quiet", action="store_true", help="no progress bar or epoch lines")
    pt.add_argument("--json", action="store_true", help="print the final result as JSON")
    pt.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard scalars (losses, beta, validation metrics per epoch) to "
        "OUT/tensorboard (needs: pip install 'vaecf[tensorboard]')",
    )
    pt.set_defaults(fn=cmd_train)


def _register_models(sub) -> None:
    pm = sub.add_parser(
        "models",
        help="list the models: name, family, what each is, its settings",
        description="Every model `--model NAME` accepts, with its family (autoencoder, "
        "linear, baseline, selection), one line on what it is and its settings with defaults.",
    )
    pm.add_argument("--json", action="store_true", help="print a JSON list")
    pm.set_defaults(fn=cmd_models)


def _register_evaluate(sub) -> None:
    pe = sub.add_parser("evaluate", help="score a run's best model on a held-out split")
    pe.add_argument("run", help="run directory written by `vaecf train`")
    pe.add_argument("--data", help="prepared dataset (unset: the one the run was trained on)")
    add_settings(pe, EvaluateSettings)
    pe.add_argument(
        "--metrics",
        help="comma-separated NAME@K (recall, ndcg, precision, map, mrr, hit, novelty, "
        "coverage, gini); default recall@20,recall@50,ndcg@100",
    )
    pe.add_argument(
        "--per-user",
        metavar="FILE",
        help="write one row per scored user (.csv or .parquet): id, history, each metric",
    )
    pe.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: each metric, n_users, n_skipped, the slices",
    )
    pe.set_defaults(fn=cmd_evaluate)
