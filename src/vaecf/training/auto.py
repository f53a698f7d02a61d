"""`--model auto`: fit the candidate models that fit the machine (and the time budget) on the
same prepared data, add a validation-weighted blend of the best linear and the best
autoencoder, and keep the best on validation. Selection never sees the test split: candidates
are fitted with `test=False` under OUT/candidates/NAME, and the winner alone is scored on test.

The run directory OUT then holds the winner under the model contract (its config.json names
the winning model, or `blend` with its two parts), so `evaluate`, `recommend`, `serve`,
`score`, `export` and `similar` work on it unchanged; results.json adds an "auto" record with
every candidate's validation metrics (a linear one's also on folds of the training users, as its
search scored them) and seconds.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from vaecf import models, rundir
from vaecf import precision as prec
from vaecf.config.modelconfigs import LINEAR_CV_BETAS, AutoConfig
from vaecf.config.settings import spelled
from vaecf.config.train import ANNEAL_SETTINGS, GRADIENT_SETTINGS, TrainConfig, from_dict
from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.data.preprocess import TIME_PROTOCOLS
from vaecf.errors import ConfigError, RunError
from vaecf.evaluate import evaluate_model, metrics_with, model_scores, per_user_metric
from vaecf.storage.safewrite import atomic_file, write_json
from vaecf.training.single import RunResult, train

BLEND_WEIGHTS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
SETTINGS = "auto_settings.json"  # the settings an auto run started with, for its resume
# validation users enough for a linear candidate's choice without the training users' folds
CV_ENOUGH_USERS = 2_000
# The share of --budget kept back from the candidates for the blend, the selection, the test and
# (in vaecf.fit) loading the Recommender: with 3% those took 7.4-7.7% of the budget (Zen 3,
# 2026-11-27: ml-latest-small's fits returned in 62.1-62.8 s of 60, ML-1M's in 118.8-119.0 of 114;
# benchmarks/README.md, "vaecf.fit's default budget")
BUDGET_RESERVE = 0.10
# A candidate after the first starts only with at least this share of --budget of its own: with
# less it trains an epoch or two, returns late (its setup, validation and writes) and does not win
# (ml-latest-small: Mult-VAE given 1.4 s of 60 took 3.7; 2026-11-27)
MIN_CANDIDATE_SHARE = 0.10


def saved_settings(out: Path) -> tuple[TrainConfig | None, AutoConfig | None]:
    """The training and selection settings an auto run in `out` started with (None, None
    where it has not started)."""
    path = Path(out) / SETTINGS
    if not path.is_file():
        return None, None
    saved = json.loads(path.read_text())
    return from_dict(TrainConfig, saved["train"]), from_dict(AutoConfig, saved["auto"])


def candidate_config(cfg: TrainConfig, name: str, budget: float | None = None) -> TrainConfig:
    """The run's training settings, less those the candidate does not read (reset), with
    `budget`: the seconds of the selection's budget left to it, less the selection's reserve."""
    reads, default = models.get(name).train_settings, TrainConfig()
    optional = (*GRADIENT_SETTINGS, *ANNEAL_SETTINGS)
    reset = {n: getattr(default, n) for n in optional if n not in reads}
    reset["progress"] = False  # one line per candidate (train_auto's); its log holds the rest
    if budget is not None:
        reset["budget"] = budget - BUDGET_RESERVE * cfg.budget
    return replace(cfg, **reset)


def candidate_model_config(name: str, auto: AutoConfig, timed: bool = False, n_validation: int = 0):
    """A candidate's model settings: its defaults, and for a linear model with `linear_cv`
    the choice of lambda, p and beta on the validation users and folds of the training users
    (on ml-latest-small and FilmTrust, 5 splits each: +0.0036 and +0.0017 test NDCG@100 for
    EDLAE against its validation-only default; benchmarks/README.md). Not under a time
    protocol (`timed`): folds of the training period judge the past at random, the validation
    period judges the future (ML-1M, --protocol temporal: validation NDCG@100 0.1633 with the
    folds, 0.1736 without; docs/accuracy.md). Nor where the validation users number
    CV_ENOUGH_USERS or more: the folds then add few users to a choice already judged by
    thousands, at cv-folds + 1 times its solves (Pinterest's shape, 5,000 validation users:
    287 s against 29 s): lambda, p and beta are then chosen on the validation users alone."""
    if not auto.linear_cv or timed or models.get(name).family != "linear":
        return None
    betas = {"popularity_grid": list(LINEAR_CV_BETAS)}  # at no extra solve: B's columns rescaled
    if n_validation >= CV_ENOUGH_USERS:
        return models.config_from_dict(name, betas)  # chosen on validation alone
    return models.config_from_dict(name, {"selection": "cv", **betas})


def train_auto(
    ds: PreparedDataset, cfg: TrainConfig, out: Path, auto: AutoConfig, test: bool, log=print
):
    for name in auto.candidates:
        if models.get(name).family not in ("autoencoder", "linear", "baseline"):
            raise ConfigError(
                f"--candidates: {name} is not a model to fit; choose among "
                + ", ".join(n for n, m in models.MODELS.items() if m.family != "selection")
            )
    if rundir.is_run(out) and (out / rundir.RESULTS).is_file():
        res = rundir.load_results(out)
        return RunResult(out, res["best_epoch"], res["validation"], res["test"], [])
    if not (out / SETTINGS).is_file():  # what a resume continues with (the run directory
        out.mkdir(parents=True, exist_ok=True)  # itself takes the winner's settings)
        write_json(out / SETTINGS, {"train": cfg.to_dict(), "auto": asdict(auto)})
    t_start = time.perf_counter()
    metric = cfg.select_metric
    record, fitted = fit_candidates(ds, cfg, out, auto, t_start, log)
    if not fitted:
        raise RunError(
            "auto: no candidate could be fitted: "
            + "; ".join(f"{r['model']}: {r['skipped']}" for r in record)
        )
    device = prec.resolve_device(cfg.device)
    val = tuple(CSR.from_scipy(ds.split(f"validation_{p}"), device) for p in ("tr", "te"))
    loaded = {n: rundir.load_model(res.run_dir, device) for n, res in fitted.items()}
    # candidate -> its validation metric per user, for the paired comparison
    per_user = {n: _per_user(m, val, metric, cfg) for n, (m, _) in loaded.items()}
    options = {n: ("single", n, fitted[n].validation_metrics) for n in fitted}
    if auto.blend:
        blend = _best_blend(ds, record, fitted, loaded, metric, val, per_user, cfg, log)
        if blend is not None:
            options["blend"] = blend
    winner, selection = choose(per_user, _best_of("linear", record, fitted, metric), auto.margin_z)
    if selection.get("challenger") == "blend":
        selection["rule"] += (
            " (the blend's values cross-fitted: each validation user's at the weight chosen on "
            "the other half of them)"
        )
    log(f"auto: {selection['rule']}")
    return _materialise(ds, cfg, out, options[winner], record, fitted, test, t_start, selection)


def fit_candidates(ds, cfg: TrainConfig, out: Path, auto: AutoConfig, t_start: float, log):
    """Each candidate fitted (or resumed) under OUT/candidates/NAME within what is left of the
    budget: (the record of every candidate, name -> RunResult of those fitted)."""
    metric = cfg.select_metric
    timed = ds.manifest["settings"]["protocol"] in TIME_PROTOCOLS
    n_validation = ds.manifest["counts"]["n_validation_users"]
    record: list[dict] = []
    fitted: dict[str, RunResult] = {}
    log(
        f"auto: fitting {', '.join(auto.candidates)}"
        + ("" if cfg.budget is None else f" within {cfg.budget:.0f} s")
        + f"; each candidate's epochs and search are in {out / 'candidates'}"
    )
    for i, name in enumerate(auto.candidates):
        row = {"model": name, "family": models.get(name).family}
        left = None if cfg.budget is None else cfg.budget - (time.perf_counter() - t_start)
        need = BUDGET_RESERVE + (MIN_CANDIDATE_SHARE if fitted else 0.0)
        given = left
        room = MIN_CANDIDATE_SHARE * (cfg.budget or 0.0)  # the next candidate's: two judged
        if left is not None and not fitted and i + 1 < len(auto.candidates):
            # kept back only where this one still has its own tenth beyond the reserve
            if left - room > (BUDGET_RESERVE + MIN_CANDIDATE_SHARE) * cfg.budget:
                given = left - room
        if left is not None and left <= need * cfg.budget:
            record.append({**row, "skipped": f"the budget ({cfg.budget:.0f} s) was spent"})
            log(f"auto: {name} skipped, the budget is spent")
            continue
        t0 = time.perf_counter()
        try:
            res = train(
                ds,
                candidate_config(cfg, name, given),
                out / "candidates" / name,
                candidate_model_config(name, auto, timed, n_validation),
                model=name,
                resume=True,
                test=False,
            )
        except RunError as e:  # what does not fit the machine (the models' memory checks)
            record.append({**row, "skipped": str(e)})
            log(f"auto: {name} skipped: {e}")
            continue
        row.update(validation=res.validation_metrics, seconds=round(time.perf_counter() - t0, 3))
        ran = rundir.load_results(res.run_dir)
        row.update(chosen_cv(res.run_dir))
        how = f"{row['seconds']:.0f} s"
        if models.get(name).closed_form and ran.get("stopped") == "budget":
            row["stopped"] = "budget"
            how += ", its search cut short by the budget"
        elif ran.get("stopped") in ("patience", "budget"):
            row.update(stopped=ran["stopped"], best_epoch=res.best_epoch, epochs=ran["epochs"])
            how += f", stopped by the {ran['stopped']} after epoch {ran['epochs']}"
            how += f", best {res.best_epoch}"
        record.append(row)
        fitted[name] = res
        log(f"auto: {name} validation {metric} {res.validation_metrics[metric]:.4f} ({how})")
    if len(fitted) == 1:
        _say_if_alone(record, cfg.budget, log)
    return record, fitted


def _say_if_alone(record: list[dict], budget: float, log) -> None:
    """Where the budget let one candidate alone be judged: which were left out, and a budget
    that would compare them."""
    spent = [r["model"] for r in record if "budget" in r.get("skipped", "")]
    if not spent:
        return
    (only,) = [r for r in record if "seconds" in r]
    log(
        f"auto: only {only['model']} was judged: the budget ({budget:.0f} s) left no time for "
        f"{', '.join(spent)}; {only['model']} alone took {only['seconds']:.0f} s, so "
        f"{spelled('budget', round(3 * only['seconds']))} or more lets auto compare it with them"
    )


def chosen_cv(run_dir: Path) -> dict:
    """A linear candidate's figures on folds of the training users at the point its search
    chose (`cv`: pooled metrics, `cv_users`), as its search recorded them; {} for a candidate
    without (an autoencoder, or a search on the validation users alone)."""
    fits = [r for r in rundir.read_metrics(run_dir) if "grid" in r]
    if not fits or not fits[0].get("grid"):
        return {}
    fit = fits[0]
    chosen = {k: fit[k] for k in ("l2", "dropout", "popularity_exponent") if k in fit}
    for row in fit["grid"]:
        at_chosen = all(row.get(k) == v for k, v in chosen.items())
        if row["stage"] == "full" and "cv" in row and at_chosen:
            return {"cv": row["cv"], "cv_users": fit.get("cv_users")}
    return {}


def _per_user(model, val, metric, cfg):
    return per_user_metric(model_scores(model), *val, metric, cfg.eval_batch_size).numpy()


def choose(per_user: dict, incumbent: str | None, margin_z: float) -> tuple[str, dict]:
    """The winner among the candidates' per-user validation values (same users, same order).

    The incumbent (the best linear candidate: closed form, nothing stochastic, the field's
    strong baseline) is kept unless the best other candidate's mean gain over it, user by user,
    exceeds `margin_z` standard errors of that gain. With tens or hundreds of validation users
    a lead of a few thousandths is noise that does not carry to test; this asks for evidence.
    Without a linear candidate the incumbent is the best on validation."""
    means = {n: float(v.mean()) for n, v in per_user.items()}
    best = max(means, key=means.get)
    if incumbent is None or best == incumbent:
        rule = f"{best} is the best on validation"
        return best, {"rule": rule, "incumbent": incumbent, "margin_z": margin_z}
    diff = per_user[best] - per_user[incumbent]
    gain = float(diff.mean())
    se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("inf")
    won = gain > margin_z * se
    winner = best if won else incumbent
    rule = (
        f"{best} leads {incumbent} by {gain:+.4f} on validation (paired standard error "
        f"{se:.4f}, {diff.size} users): {winner} kept"
        + ("" if won else f" (a lead must exceed {margin_z:g} standard errors)")
    )
    return winner, {
        "rule": rule,
        "incumbent": incumbent,
        "challenger": best,
        "gain": gain,
        "se": se,
        "margin_z": margin_z,
    }


def cross_fitted(per_weight: np.ndarray, seed: int = 0) -> np.ndarray:
    """(users,) from (weights, users) per-user validation values: the validation users split in
    two random halves, each user's value at the weight best on the other half. The weight
    chosen on all users would score its own choice: its lead over the linear model then
    includes the best of nine draws of noise (on ml-latest-small and FilmTrust the in-sample
    leads of +0.0005 to +0.013 were -0.010 to +0.007 cross-fitted), which the paired rule in
    `choose` does not allow for. With fewer than two users, the values of the overall best."""
    n = per_weight.shape[1]
    if n < 2:
        return per_weight[per_weight.mean(1).argmax()]
    half = np.zeros(n, dtype=bool)
    half[np.random.default_rng(seed).permutation(n)[: n // 2]] = True
    out = np.empty(n)
    for chosen_on in (half, ~half):
        out[~chosen_on] = per_weight[per_weight[:, chosen_on].mean(1).argmax(), ~chosen_on]
    return out


def _best_of(family: str, record: list, fitted: dict, metric: str) -> str | None:
    names = [r["model"] for r in record if r["model"] in fitted and r["family"] == family]
    return max(names, key=lambda n: fitted[n].validation_metrics[metric], default=None)


def blend_of(n_items: int, parts: dict):
    """The blend of `parts` (name -> (model, saved config) as `rundir.load_model` gives, the
    linear one first), holding their weights, at weight 0.5."""
    cfg = models.config_from_dict(
        "blend",
        {
            "parts": list(parts),
            "configs": [saved["model"]["config"] for _, saved in parts.values()],
            "weight": 0.5,
        },
    )
    blend = models.build("blend", n_items, cfg)
    for sub, (m, _) in zip(blend.parts, parts.values()):
        sub.load_state_dict(m.state_dict())
    return blend


def _best_blend(ds, record, fitted, loaded, metric, val, per_user, cfg, log):
    linear = _best_of("linear", record, fitted, metric)
    auto_enc = _best_of("autoencoder", record, fitted, metric)
    if linear is None or auto_enc is None:
        return None
    t0 = time.perf_counter()
    device = prec.resolve_device(cfg.device)
    blend = blend_of(ds.n_items, {n: loaded[n] for n in (linear, auto_enc)}).to(device)
    tried, best, per_weight = [], None, []
    for w in BLEND_WEIGHTS:
        blend.config.weight = w
        m = evaluate_model(blend, *val, metrics_with(metric), batch_size=cfg.eval_batch_size)
        tried.append({"weight": w, "validation": m})
        per_weight.append(_per_user(blend.eval(), val, metric, cfg))
        if best is None or m[metric] > best[1][metric]:
            best = (w, m)
    blend.config.weight = best[0]
    # what the selection compares: each user's value at the weight chosen without that user
    per_user["blend"] = cross_fitted(np.stack(per_weight))
    record.append(
        {
            "model": "blend",
            "family": "selection",
            "parts": [linear, auto_enc],
            "weight": best[0],
            "validation": best[1],
            "cross_fitted": float(per_user["blend"].mean()),
            "weights_tried": tried,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
    log(
        f"auto: blend of {linear} and {auto_enc} (weight {best[0]:g}) validation {metric} "
        f"{best[1][metric]:.4f}; {per_user['blend'].mean():.4f} with each user's weight chosen "
        "on the other half of them, what the selection compares"
    )
    return ("blend", blend, best[1])


def _materialise(ds, cfg, out, winner, record, fitted, test, t_start, selection):
    """Write the winner into `out` as a run of its own and score the test split once."""
    kind, what, val = winner
    out.mkdir(parents=True, exist_ok=True)
    source = {"best_epoch": None, "epochs": 1, "steps": 0}  # a blend: no epochs of its own
    if kind == "single":
        src = fitted[what].run_dir
        model, saved = rundir.load_model(src, "cpu")
        name, model_cfg, train_cfg = what, saved["model"]["config"], saved["train"]
        source_metrics = (src / rundir.METRICS).read_bytes()
        ran = rundir.load_results(src)  # the winner's own epochs, and why it stopped
        source = {k: ran[k] for k in ("best_epoch", "epochs", "steps", "stopped") if k in ran}
    else:
        model, name = what.cpu(), "blend"
        model_cfg = models.config_to_dict(model.config)
        train_cfg, source_metrics = candidate_config(cfg, "blend").to_dict(), b""
    rundir.start_run(out, name, model_cfg, train_cfg, ds)
    rundir.save_model(out, model, epoch=source["best_epoch"], metrics=val)
    with atomic_file(out / rundir.METRICS, "wb") as f:
        f.write(source_metrics)
    test_metrics = None
    if test:
        fold_in, target = (CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te"))
        every = metrics_with(cfg.select_metric)
        test_metrics = evaluate_model(model, fold_in, target, every, cfg.eval_batch_size)
    results = {
        "model": name,
        "validation": val,
        "test": test_metrics,
        **source,
        "auto": {
            "winner": name if kind == "single" else f"blend({','.join(model.config.parts)})",
            "select_metric": cfg.select_metric,
            "selection": selection,
            "candidates": record,
            "seconds": round(time.perf_counter() - t_start, 3),
        },
    }
    write_json(out / rundir.RESULTS, results)
    return RunResult(out, source["best_epoch"], val, test_metrics, [])
