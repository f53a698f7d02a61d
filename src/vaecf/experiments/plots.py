"""Pictures (matplotlib, Agg backend: no display needed): training curves of runs (`vaecf plot`;
a closed-form run's search instead where every run is fitted in closed form: experiments.
searchplot), a study's optimization history and parameter importances (`vaecf tune`), and a
comparison's bar chart with error bars (`vaecf compare`)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from vaecf import rundir
from vaecf.config import specs
from vaecf.errors import RunError
from vaecf.experiments.figures import pyplot, save_figure

TRAIN_PANELS = (
    ("loss", "training loss (NLL + beta KL)", "nats per user"),
    ("nll", "multinomial NLL", "nats per user"),
    ("kl", "KL divergence", "nats per user"),
    ("beta", "KL weight beta", "beta"),
)
VAL_PANELS = ("ndcg@100", "recall@20", "recall@50")


def _label(run: Path, cfg: dict, names: list[Path]) -> str:
    """A short legend label: the model and the run directory's name (made unique)."""
    name = run.name if sum(p.name == run.name for p in names) == 1 else str(run)
    return f"{name} ({cfg['model']['name']})"


def plot_runs(
    runs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    labels: Sequence[str] | None = None,
) -> Path:
    """One figure of the runs' per-epoch training loss, NLL, KL, beta and validation metrics,
    overlaid, each run's selected (best) epoch marked; a closed-form run (fitted once) is a
    level line at its validation metrics. Where every run is closed-form the figure is their
    searches instead (`searchplot.plot_searches`). Returns the PNG path."""
    runs = [Path(r) for r in runs]
    if not runs:
        raise RunError("pass at least one run directory")
    if not Path(out).parent.is_dir():  # made by nobody but its owner, as every verb's --out
        raise RunError(f"{Path(out).parent} does not exist; create it or choose another --out")
    data, fits = _read_runs(runs, labels)
    if not data:
        from vaecf.experiments.searchplot import plot_searches

        return plot_searches(fits, Path(out))
    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(17, 8), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, title, unit) in zip(axes[0], TRAIN_PANELS):
        for i, (label, rows, _, best) in enumerate(data):
            pts = [(r["epoch"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            _curve(ax, pts, best, colors[i % len(colors)], label)
        _decorate(ax, title, unit)
    val_keys = list(VAL_PANELS)
    for _, _rows, metric, _ in data:
        if metric not in val_keys:
            val_keys[0] = metric
    for ax, key in zip(axes[1], val_keys):
        for i, (label, rows, _, best) in enumerate(data):
            pts = [
                (r["epoch"], r["validation"][key])
                for r in rows
                if key in (r.get("validation") or {})
            ]
            _curve(ax, pts, best, colors[i % len(colors)], label)
        for i, (run, label, _, rows, _) in enumerate(fits, len(data)):
            value = (_validation(run) or (rows or [{}])[0].get("validation") or {}).get(key)
            if isinstance(value, (int, float)):
                ax.axhline(value, color=colors[i % len(colors)], ls=":", lw=1.4, label=label)
        _decorate(ax, f"validation {key}", key)
    _legend(plt, axes[1][3], data, fits, colors)
    n = len(data) + len(fits)
    fig.suptitle(f"training curves of {n} run{'s' if n > 1 else ''}", fontsize=13)
    out = save_figure(fig, Path(out))
    plt.close(fig)
    return out


def _read_runs(runs: list[Path], labels) -> tuple[list, list]:
    """(gradient runs as (label, metrics rows, select metric, best epoch), closed-form runs as
    (run, label, config, rows, metric)); a run with nothing to plot yet is refused."""
    data, fits = [], []
    for i, run in enumerate(runs):
        cfg = rundir.load_config(run)
        rows = rundir.read_metrics(run)
        closed = closed_form(cfg, rows)
        if not rows and not (closed and (run / rundir.RESULTS).is_file()):
            raise RunError(f"{run} has no {rundir.METRICS} yet: train it first")
        label = labels[i] if labels else _label(run, cfg, runs)
        metric = cfg["train"].get("select_metric", "ndcg@100")
        if closed:
            fits.append((run, label, cfg, rows, metric))
        else:
            data.append((label, rows, metric, _best_epoch(run, rows, metric)))
    return data, fits


def _legend(plt, ax, data: list, fits: list, colors: list) -> None:
    """The figure's legend in its own panel: each run's colour, its best epoch or closed form."""
    ax.axis("off")
    handles = [
        plt.Line2D([], [], color=colors[i % len(colors)], label=f"{lab} (best epoch {best})")
        for i, (lab, _, _, best) in enumerate(data)
    ]
    handles += [
        plt.Line2D([], [], color=colors[i % len(colors)], ls=":", label=f"{lab} (closed form)")
        for i, (_, lab, *_) in enumerate(fits, len(data))
    ]
    handles.append(
        plt.Line2D([], [], color="grey", ls="--", marker="*", ms=10, label="selected epoch")
    )
    ax.legend(handles=handles, loc="center", fontsize=10, frameon=False)


def closed_form(cfg: dict, rows: list[dict]) -> bool:
    """The run was fitted once (EASE, EDLAE, inf-AE, popularity, a blend): it has no
    per-epoch curve. A model not declared here: one metrics row without a loss."""
    spec = specs.SPECS.get(cfg["model"]["name"])
    if spec is not None:
        return spec.closed_form
    return len(rows) <= 1 and not any("loss" in r for r in rows)


def _validation(run: Path) -> dict | None:
    try:
        return rundir.load_results(run).get("validation")
    except RunError:
        return None


def _best_epoch(run: Path, rows: list[dict], metric: str) -> int | None:
    try:
        return int(rundir.load_results(run)["best_epoch"])
    except (RunError, KeyError, TypeError, ValueError):
        vals = [(r["validation"][metric], r["epoch"]) for r in rows if r.get("validation")]
        return max(vals)[1] if vals else None


def _curve(ax, pts, best, color, label) -> None:
    if not pts:
        return
    xs, ys = zip(*pts)
    ax.plot(xs, ys, color=color, lw=1.4, label=label, marker="o" if len(xs) < 3 else None)
    if best is not None:
        ax.axvline(best, color=color, ls="--", lw=0.8, alpha=0.7)
        at = [y for x, y in pts if x == best]
        if at:
            ax.plot([best], at, marker="*", ms=12, color=color, mec="black", mew=0.5)


def _decorate(ax, title: str, unit: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title, fontsize=11)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
    ax.set_xlabel("epoch")
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3)
    if not ax.lines:
        ax.text(
            0.5,
            0.5,
            "not logged by these runs",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="grey",
        )


# -- a study -------------------------------------------------------------------------------------
def plot_study(study, out_dir: Path, metric: str, log: Callable[[str], None] = print) -> dict:
    """history.png (every trial's validation value, the best so far) and importance.png
    (parameter importances, when at least two trials are complete). Returns what it wrote."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    written = {"history_png": _plot_history(trials, Path(out_dir) / "history.png", metric)}
    complete = sum(t.state == TrialState.COMPLETE for t in trials)
    if complete < 2:
        log("parameter importances need at least two complete trials: importance.png skipped")
        return written
    import optuna

    try:
        imp = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError, ZeroDivisionError) as e:
        log(f"parameter importances could not be computed ({e}): importance.png skipped")
        return written
    if imp:
        path = Path(out_dir) / "importance.png"
        written["importance_png"] = _plot_importances(imp, complete, path, metric)
    return written


def _plot_history(trials, path: Path, metric: str) -> Path:
    """Complete trials' values and the best so far; pruned and stopped trials' best before."""
    from matplotlib.ticker import MaxNLocator
    from optuna.trial import TrialState

    plt = pyplot()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED and t.intermediate_values]
    stopped = [
        t
        for t in trials
        if t.state == TrialState.FAIL and "interrupted" in t.user_attrs and t.intermediate_values
    ]
    fig, ax = plt.subplots(figsize=(8, 4.8), constrained_layout=True)
    if complete:
        numbers = [t.number for t in complete]
        ax.plot(numbers, [t.value for t in complete], "o", color="tab:blue", label="complete trial")
        best, xs, ys = -math.inf, [], []
        for t in sorted(complete, key=lambda t: t.number):
            best = max(best, t.value)
            xs.append(t.number)
            ys.append(best)
        last = max(t.number for t in trials)
        if last > xs[-1]:  # carry the best on to the last trial
            xs.append(last)
            ys.append(ys[-1])
        ax.step(xs, ys, where="post", color="tab:red", label="best so far")
    for group, style, label in (
        (pruned, {"marker": "x"}, "pruned trial (best before pruning)"),
        (
            stopped,
            {"marker": "o", "mfc": "none"},
            "stopped trial (best so far; continued by --resume)",
        ),
    ):
        if group:
            numbers = [t.number for t in group]
            best_before = [max(t.intermediate_values.values()) for t in group]
            ax.plot(numbers, best_before, ls="none", color="grey", label=label, **style)
    if not complete and not pruned and not stopped:
        ax.text(0.5, 0.5, "no finished trial yet", ha="center", va="center", transform=ax.transAxes)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial number")
    ax.set_ylabel(f"validation {metric}")
    ax.set_title(
        f"optimization history ({len(complete)} complete, {len(pruned)} pruned, "
        f"{len(stopped)} stopped)"
    )
    ax.grid(alpha=0.3)
    if complete or pruned or stopped:
        ax.legend(
            loc="upper center", bbox_to_anchor=(0.5, -0.13), ncols=2, fontsize=9, frameon=False
        )
    save_figure(fig, path)
    plt.close(fig)
    return path


def _plot_importances(imp: dict, complete: int, path: Path, metric: str) -> Path:
    """One bar per parameter, largest at the top, its share written beside it."""
    plt = pyplot()
    names = list(imp)[::-1]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.6), constrained_layout=True)
    ax.barh(names, [imp[n] for n in names], color="tab:blue")
    for y, n in enumerate(names):
        ax.text(imp[n], y, f" {imp[n]:.2f}", va="center", fontsize=9)
    ax.set_xlabel(f"importance for validation {metric} (share, sums to 1)")
    ax.set_ylabel("parameter")
    ax.set_xlim(0, max(imp.values()) * 1.15 or 1)
    ax.set_title(f"parameter importances over {complete} complete trials")
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)
    return path


# -- a comparison --------------------------------------------------------------------------------
def plot_compare(summary: dict, out: str | os.PathLike) -> Path:
    """Grouped bars: each metric's mean test value per model, error bars one standard deviation
    over the splits, the individual splits as dots."""
    import numpy as np

    plt = pyplot()
    labels = summary["labels"]
    metrics = summary["metrics"]
    per = summary["per_split"]  # label -> metric -> [values]
    n = len(labels)
    width = 0.8 / n
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(
        figsize=(max(7, 2.4 * len(metrics) + 0.6 * n), 5), constrained_layout=True
    )
    x = np.arange(len(metrics))
    for i, lab in enumerate(labels):
        vals = [per[lab][m] for m in metrics]
        means = [float(np.mean(v)) for v in vals]
        sds = [float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for v in vals]
        pos = x - 0.4 + width * (i + 0.5)
        ax.bar(
            pos,
            means,
            width * 0.92,
            yerr=sds,
            capsize=4,
            color=colors[i % len(colors)],
            label=lab,
            alpha=0.85,
        )
        for p, v in zip(pos, vals):  # the splits, spread across the bar beside the error bar
            spread = np.linspace(-0.3, 0.3, len(v)) * width if len(v) > 1 else [0.0]
            ax.plot(p + np.asarray(spread), v, ".", color="black", ms=5, alpha=0.7)
    ax.set_xticks(x, [f"test {m}" for m in metrics])
    ax.set_ylabel("metric value (mean over splits; bars: ± 1 sd; dots: splits)")
    ax.set_title(f"test metrics over {summary['n_splits']} split(s)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(ncols=min(n, 4), loc="upper center", bbox_to_anchor=(0.5, -0.08), frameon=False)
    out = save_figure(fig, Path(out))
    plt.close(fig)
    return out
