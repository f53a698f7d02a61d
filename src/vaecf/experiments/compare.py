"""Comparing models over splits (`vaecf compare`): training each model on each split, or reading
finished runs, and summarising their test metrics (mean and sd per model; the paired difference
to the first model with a paired t-test over the splits).

    OUT/data/seed-S/          the raw interactions prepared with split seed S (reused)
    OUT/runs/LABEL/seed-S/    LABEL's run on split S (seed S also seeds training); a finished
                              run is reused, an unfinished one resumed from its checkpoint
    OUT/compare_splits.csv    one row per model and split: its test metrics
    OUT/compare_summary.csv   per model and metric: n, mean, sd, paired difference, t, p
    OUT/compare.json          both, with the run directories
    OUT/compare.png           bars of the means, error bars one sd, the splits as dots

Runs are paired by their prepared dataset (its fingerprint): a split enters the summary only where
every model has a finished run on it.
"""

from __future__ import annotations

import csv
import math
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vaecf import models, rundir
from vaecf.config import toml as configfile
from vaecf.errors import ConfigError, RunError
from vaecf.experiments.rescore import paired_by_user
from vaecf.storage.safewrite import atomic_file, write_json

METRICS = ("ndcg@100", "recall@20", "recall@50")


@dataclass
class Entry:
    """A model in a comparison: its label, registry name and settings (from a TOML file)."""

    label: str
    model: str
    settings: configfile.RunSettings = field(default_factory=configfile.RunSettings)
    source: str | None = None


def parse_models(spec: str | Sequence[str]) -> list[Entry]:
    """`multvae,ease,tuned=STUDY/best.toml`: registry names, or LABEL=FILE.toml entries whose
    file names the model (a `vaecf tune` best.toml, a run's config.toml)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    entries: list[Entry] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        if "=" in item:
            label, path = (s.strip() for s in item.split("=", 1))
            settings = configfile.read(path)
            if settings.model is None:
                raise ConfigError(f'{path} does not name its model ([model] name = "...")')
            models.get(settings.model)
            entries.append(Entry(label, settings.model, settings, path))
        else:
            models.get(item)
            entries.append(Entry(item, item))
    bad = [e.label for e in entries if not re.fullmatch(r"[A-Za-z0-9_.+-]+", e.label)]
    if bad:
        raise ConfigError(
            f"label {bad[0]!r}: labels name directories; use letters, digits and _ . + -"
        )
    labels = [e.label for e in entries]
    dup = sorted({lab for lab in labels if labels.count(lab) > 1})
    if dup:
        raise ConfigError(f"--models lists {', '.join(dup)} twice; give LABEL=FILE.toml labels")
    if not entries:
        raise ConfigError("--models is empty; e.g. --models multvae,recvae,ease,popular")
    return entries


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, not {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError("--seeds must list distinct integers, e.g. 98765,1,2,3,4")
    return seeds


@dataclass
class Record:
    label: str
    split: str  # shown: "seed S" or the dataset's directory name
    key: str  # what pairs runs: the prepared dataset's fingerprint (and seed, on one split)
    run_dir: Path
    test: dict
    per_user: object = None  # each test user's values (rescore: vaecf.run_evaluation)


def train_all(
    csv_path: str | os.PathLike,
    out: str | os.PathLike,
    entries: list[Entry],
    seeds: Sequence[int],
    prepare: dict,
    epochs: int | None = None,
    device: str | None = None,
    log: Callable[[str], None] = print,
) -> list[Record]:
    """Prepare `csv_path` once per seed (prepare_csv keyword arguments in `prepare`, settings
    as PrepareSettings fields) and train every entry on every split: finished runs are reused,
    unfinished ones resumed. A lock keeps a second compare off `out`.

    `csv_path` may also be a prepared dataset directory: its one split is used for every seed,
    and the seeds vary the training only (`prepare` must then be empty)."""
    from vaecf.experiments.study import locked

    out, prepare = Path(out), dict(prepare)
    out.mkdir(parents=True, exist_ok=True)
    with locked(out, "compare"):
        return _train_all(csv_path, out, entries, seeds, prepare, epochs, device, log)


def _train_all(csv_path, out, entries, seeds, prepare, epochs, device, log) -> list[Record]:
    from vaecf.config.train import TrainConfig
    from vaecf.data.columns import found_by_name
    from vaecf.data.prepare import PrepareSettings, load_prepared, prepare_csv
    from vaecf.training import train

    keys = ("user_col", "item_col", "rating_col", "sep", "header", "columns")
    columns = {k: prepare.pop(k) for k in keys if k in prepare}
    prepared = load_prepared(csv_path) if (Path(csv_path) / "manifest.json").is_file() else None
    if prepared is not None:
        log(
            f"{csv_path} is a prepared dataset: every seed uses its one split "
            "(its held-out users); the seeds vary the training only"
        )
    records = []
    for seed in seeds:
        ds = prepared or prepare_csv(
            csv_path,
            out / "data" / f"seed-{seed}",
            settings=PrepareSettings(**prepare, seed=seed),
            **columns,
        )
        if seed == seeds[0] and prepared is None:
            given = {w: columns.get(f"{w}_col") for w in ("user", "item", "rating")}
            src = ds.manifest["source"]
            kept = ds.manifest["settings"]["min_rating"]
            if found := found_by_name(given, src["columns"], src.get("sep_found"), kept):
                log(found)
        for e in entries:
            run = out / "runs" / e.label / f"seed-{seed}"
            cls = models.get(e.model)
            if (run / rundir.RESULTS).is_file():
                log(f"seed {seed}  {e.label}: finished run reused ({run})")
            else:
                state = "resumed" if rundir.is_run(run) else "training"
                log(f"seed {seed}  {e.label}: {state} ({run})")
                tdict = {**e.settings.train, "seed": seed, "progress": False}
                if epochs is not None and "epochs" in cls.train_settings:
                    tdict["epochs"] = epochs
                if device is not None:
                    tdict["device"] = device
                mcfg = models.config_from_dict(e.model, e.settings.model_config)
                if rundir.is_run(run):  # a resume keeps the run's own settings
                    train(ds, None, run, None, resume=True, model=e.model)
                else:
                    train(ds, TrainConfig(**tdict), run, mcfg, resume=True, model=e.model)
            rec = _record(run, e.label, f"seed {seed}")
            if prepared is not None:  # one split, many training seeds: pair runs by seed
                rec.key = f"{rec.key}/seed-{seed}"
            records.append(rec)
    return records


def _record(run: Path, label: str, split: str | None = None) -> Record:
    cfg = rundir.load_config(run)
    res = rundir.load_results(run)
    if not res.get("test"):
        raise RunError(
            f"{run} has no test metrics (a `vaecf tune` trial?); score it with "
            f"`vaecf evaluate {run}` or pass finished `vaecf train` runs"
        )
    data = cfg["data"]
    name = split or f"{Path(data['path']).name} ({data['fingerprint'][:8]})"
    return Record(label, name, data["fingerprint"], run, res["test"])


def read_runs(specs: Sequence[str]) -> list[Record]:
    """Finished run directories, `RUN` (labelled by its model) or `LABEL=RUN`."""
    records = []
    for spec in specs:
        label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        run = Path(path)
        label = label or rundir.load_config(run)["model"]["name"]
        records.append(_record(run, label))
    seen: dict = {}
    for r in records:
        if (r.label, r.key) in seen:
            raise ConfigError(
                f"{seen[(r.label, r.key)]} and {r.run_dir} are both {r.label} runs on the same "
                "split; label them apart: LABEL=RUN"
            )
        seen[(r.label, r.key)] = r.run_dir
    return records


def summarize(records: list[Record], metrics: Sequence[str] = METRICS) -> dict:
    """Per label: n, mean, sd of each test metric over the splits every label has; per label
    after the first: the paired difference to the first (mean, sd), t and the p-value of the
    paired t-test (scipy.stats.ttest_rel; None where undefined: one split, or no variation)."""
    labels: list[str] = []
    for r in records:
        if r.label not in labels:
            labels.append(r.label)
    keys_of = {lab: {r.key for r in records if r.label == lab} for lab in labels}
    common = set.intersection(*keys_of.values()) if labels else set()
    order = []  # splits in first-seen order
    for r in records:
        if r.key in common and r.key not in order:
            order.append(r.key)
    dropped = sorted({r.split for r in records if r.key not in common})
    if not order:
        raise RunError("no split has a finished run of every model: nothing to compare")
    by = {(r.label, r.key): r for r in records}
    split_names = [by[(labels[0], k)].split for k in order]
    per = {
        lab: {m: [float(by[(lab, k)].test[m]) for k in order] for m in metrics} for lab in labels
    }
    ref = labels[0]
    rows = [
        paired_row(lab, m, per[lab][m], None if lab == ref else per[ref][m], ref)
        for lab in labels
        for m in metrics
    ]
    return {
        "labels": labels,
        "metrics": list(metrics),
        "splits": split_names,
        "n_splits": len(order),
        "dropped_splits": dropped,
        "per_split": per,
        "summary": rows,
        "by_user": paired_by_user(records, metrics, paired_row),
        "runs": {lab: [str(by[(lab, k)].run_dir) for k in order] for lab in labels},
    }


def paired_row(label: str, metric: str, values: list, ref_values: list | None, ref: str) -> dict:
    """One label's figures for one metric; beside `ref_values` (the first label's), the paired
    difference, t and the paired t-test's p-value."""
    import numpy as np
    from scipy import stats

    v = np.array(values)
    row = {
        "label": label,
        "metric": metric,
        "n": len(v),
        "mean": float(v.mean()),
        "sd": float(v.std(ddof=1)) if len(v) > 1 else None,
        "diff_to": None if ref_values is None else ref,
        "diff_mean": None,
        "diff_sd": None,
        "t": None,
        "p": None,
    }
    if ref_values is not None:
        d = v - np.array(ref_values)
        row["diff_mean"] = float(d.mean())
        row["diff_sd"] = float(d.std(ddof=1)) if len(d) > 1 else None
        if len(d) > 1:
            # identical differences (deterministic models on one split): no p-value
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                t, p = stats.ttest_rel(v, np.array(ref_values))
            row["t"] = None if math.isnan(t) else float(t)
            row["p"] = None if math.isnan(p) else float(p)
    return row


def _p(p: float | None) -> str:
    if p is None:
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def format_summary(s: dict) -> str:
    """The summary as a text table: mean ± sd per model and metric; for every model after the
    first, the paired difference to the first and the paired t-test's p (the slices' figures
    are in the CSV and JSON); on one split, each metric and slice paired user by user."""
    labels, metrics = s["labels"], [m for m in s["metrics"] if "[" not in m]
    ref = labels[0]
    cells = {(r["label"], r["metric"]): r for r in s["summary"]}
    w = max(8, *(len(lab) for lab in labels))
    head = f"{'model':{w}s}" + "".join(f"  {m:>15s}  {'diff':>7s} {'p':>6s}" for m in metrics)
    lines = [
        f"test metrics over {s['n_splits']} split(s): mean ± sd; diff: paired difference to "
        f"{ref}; p: paired t-test over the splits",
        head,
    ]
    for lab in labels:
        line = f"{lab:{w}s}"
        for m in metrics:
            c = cells[(lab, m)]
            sd = f"{c['sd']:.4f}" if c["sd"] is not None else "-"
            line += f"  {c['mean']:.4f} ± {sd:>6s}"
            if c["diff_mean"] is None:
                line += f"  {'':>7s} {'':>6s}"
            else:
                line += f"  {c['diff_mean']:+.4f} {_p(c['p']):>6s}"
        lines.append(line.rstrip())
    if s["dropped_splits"]:
        lines.append(f"left out (not every model has a finished run): {s['dropped_splits']}")
    if s.get("by_user"):
        lines += ["", f"paired over the test users (one split), against {ref}:"]
        lines.append(f"{'model':{w}s}  {'metric [history slice]':26s} {'users':>6s}  {'mean':>7s}"
                     f"  {'diff':>8s}  {'p':>6s}")  # fmt: skip
        for r in s["by_user"]:
            lines.append(
                f"{r['label']:{w}s}  {r['metric']:26s} {r['n']:6d}  {r['mean']:7.4f}  "
                f"{r['diff_mean']:+8.4f}  {_p(r['p']):>6s}"
            )
    return "\n".join(lines)


def write_outputs(s: dict, out: str | os.PathLike, plot: bool = True) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    path = out / "compare_splits.csv"
    with atomic_file(path, "w", newline="") as f:  # a kill mid-write leaves the old table
        w = csv.writer(f)
        w.writerow(["label", "split", *s["metrics"], "run_dir"])
        for lab in s["labels"]:
            for i, split in enumerate(s["splits"]):
                w.writerow(
                    [
                        lab,
                        split,
                        *(s["per_split"][lab][m][i] for m in s["metrics"]),
                        s["runs"][lab][i],
                    ]
                )
    files["splits_csv"] = path
    path = out / "compare_summary.csv"
    with atomic_file(path, "w", newline="") as f:
        keys = list(s["summary"][0])
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(s["summary"])
    files["summary_csv"] = path
    write_json(out / "compare.json", s)
    files["json"] = out / "compare.json"
    if plot:
        from vaecf.experiments.plots import plot_compare

        files["png"] = plot_compare(s, out / "compare.png")
    return files
