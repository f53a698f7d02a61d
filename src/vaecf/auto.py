"""`--model auto`: fit the candidate models that fit the machine (and the time budget) on the
same prepared data, add a validation-weighted blend of the best linear and the best
autoencoder, and keep the best on validation. Selection never sees the test split: candidates
are fitted with `test=False` under OUT/candidates/NAME, and the winner alone is scored on test.

The run directory OUT then holds the winner under the model contract (its config.json names
the winning model, or `blend` with its two parts), so `evaluate`, `recommend`, `serve`,
`score`, `export` and `similar` work on it unchanged; results.json adds an "auto" record with
every candidate's validation metrics and seconds.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from vaecf import models, rundir
from vaecf import precision as prec
from vaecf._io import atomic_file, write_json
from vaecf.config import ANNEAL_SETTINGS, GRADIENT_SETTINGS, TrainConfig
from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.errors import ConfigError, RunError
from vaecf.evaluate import evaluate_model
from vaecf.models.blend import AutoConfig

BLEND_WEIGHTS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def candidate_config(cfg: TrainConfig, name: str) -> TrainConfig:
    """The run's training settings, less those the candidate does not read (reset)."""
    reads, default = models.get(name).train_settings, TrainConfig()
    optional = (*GRADIENT_SETTINGS, *ANNEAL_SETTINGS)
    return replace(cfg, **{n: getattr(default, n) for n in optional if n not in reads})


def train_auto(
    ds: PreparedDataset, cfg: TrainConfig, out: Path, auto: AutoConfig, test: bool, log=print
):
    from vaecf.trainer import RunResult, train

    for name in auto.candidates:
        if models.get(name).family not in ("autoencoder", "linear", "baseline"):
            raise ConfigError(
                f"--candidates: {name} is not a model to fit; choose among "
                + ", ".join(n for n, m in models.MODELS.items() if m.family != "selection")
            )
    if rundir.is_run(out) and (out / rundir.RESULTS).is_file():
        res = rundir.load_results(out)
        return RunResult(out, res["best_epoch"], res["validation"], res["test"], [])
    t_start = time.perf_counter()
    metric = cfg.select_metric
    record, fitted = [], {}
    for name in auto.candidates:
        spent = time.perf_counter() - t_start
        row = {"model": name, "family": models.get(name).family}
        if auto.budget is not None and spent >= auto.budget:
            record.append({**row, "skipped": f"the budget ({auto.budget:g} s) was spent"})
            log(f"auto: {name} skipped, the budget is spent")
            continue
        t0 = time.perf_counter()
        try:
            res = train(
                ds,
                candidate_config(cfg, name),
                out / "candidates" / name,
                model=name,
                resume=True,
                test=False,
            )
        except RunError as e:  # what does not fit the machine (the models' memory checks)
            record.append({**row, "skipped": str(e)})
            log(f"auto: {name} skipped: {e}")
            continue
        row.update(validation=res.validation_metrics, seconds=round(time.perf_counter() - t0, 3))
        record.append(row)
        fitted[name] = res
        log(f"auto: {name} validation {metric} {res.validation_metrics[metric]:.4f}")
    if not fitted:
        raise RunError(
            "auto: no candidate could be fitted: "
            + "; ".join(f"{r['model']}: {r['skipped']}" for r in record)
        )
    best = max(fitted, key=lambda n: fitted[n].validation_metrics[metric])
    winner = ("single", best, fitted[best].validation_metrics)
    if auto.blend:
        blend = _best_blend(ds, cfg, record, fitted, metric, log)
        if blend is not None and blend[2][metric] > winner[2][metric]:
            winner = blend
    return _materialise(ds, cfg, out, winner, record, fitted, test, t_start)


def _best_of(family: str, record: list, fitted: dict, metric: str) -> str | None:
    names = [r["model"] for r in record if r["model"] in fitted and r["family"] == family]
    return max(names, key=lambda n: fitted[n].validation_metrics[metric], default=None)


def _best_blend(ds, cfg, record, fitted, metric, log):
    linear = _best_of("linear", record, fitted, metric)
    auto_enc = _best_of("autoencoder", record, fitted, metric)
    if linear is None or auto_enc is None:
        return None
    t0 = time.perf_counter()
    device = prec.resolve_device(cfg.device)
    parts = [rundir.load_model(fitted[n].run_dir, device) for n in (linear, auto_enc)]
    blend_cfg = models.config_from_dict(
        "blend",
        {
            "parts": [linear, auto_enc],
            "configs": [p[1]["model"]["config"] for p in parts],
            "weight": 0.5,
        },
    )
    blend = models.build("blend", ds.n_items, blend_cfg).to(device)
    for sub, (m, _) in zip(blend.parts, parts):
        sub.load_state_dict(m.state_dict())
    val = tuple(CSR.from_scipy(ds.split(f"validation_{p}"), device) for p in ("tr", "te"))
    tried, best = [], None
    for w in BLEND_WEIGHTS:
        blend.config.weight = w
        m = evaluate_model(blend, *val, batch_size=cfg.eval_batch_size)
        tried.append({"weight": w, "validation": m})
        if best is None or m[metric] > best[1][metric]:
            best = (w, m)
    blend.config.weight = best[0]
    record.append(
        {
            "model": "blend",
            "family": "selection",
            "parts": [linear, auto_enc],
            "weight": best[0],
            "validation": best[1],
            "weights_tried": tried,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
    log(
        f"auto: blend of {linear} and {auto_enc} (weight {best[0]:g}) validation {metric} "
        f"{best[1][metric]:.4f}"
    )
    return ("blend", blend, best[1])


def _materialise(ds, cfg, out, winner, record, fitted, test, t_start):
    """Write the winner into `out` as a run of its own and score the test split once."""
    from vaecf.trainer import RunResult

    kind, what, val = winner
    out.mkdir(parents=True, exist_ok=True)
    if kind == "single":
        src = fitted[what].run_dir
        model, saved = rundir.load_model(src, "cpu")
        name, model_cfg, train_cfg = what, saved["model"]["config"], saved["train"]
        source_metrics = (src / rundir.METRICS).read_bytes()
    else:
        model, name = what.cpu(), "blend"
        model_cfg = models.config_to_dict(model.config)
        train_cfg, source_metrics = candidate_config(cfg, "blend").to_dict(), b""
    rundir.start_run(out, name, model_cfg, train_cfg, ds)
    rundir.save_model(out, model, epoch=1, metrics=val)
    with atomic_file(out / rundir.METRICS, "wb") as f:
        f.write(source_metrics)
    test_metrics = None
    if test:
        fold_in, target = (CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te"))
        test_metrics = evaluate_model(model, fold_in, target, batch_size=cfg.eval_batch_size)
    results = {
        "model": name,
        "best_epoch": 1,
        "validation": val,
        "test": test_metrics,
        "epochs": 1,
        "steps": 0,
        "auto": {
            "winner": name if kind == "single" else f"blend({','.join(model.config.parts)})",
            "select_metric": cfg.select_metric,
            "candidates": record,
            "seconds": round(time.perf_counter() - t_start, 3),
        },
    }
    write_json(out / rundir.RESULTS, results)
    return RunResult(out, 1, val, test_metrics, [])
