"""`vaecf plot` of closed-form runs (EASE, EDLAE, inf-AE): no training curve, but the search
their fit recorded (metrics.jsonl's one row, its "grid"): the validation metric over lambda,
one line per dropout p and penalty beta, a panel per stage (the fast search's coarse grid on
the most popular items, then the full catalogue), the chosen point starred."""

from __future__ import annotations

from pathlib import Path

from vaecf.errors import RunError
from vaecf.experiments.figures import pyplot, save_figure

# the parameter on the x axis: EASE and EDLAE's lambda, inf-AE's kernel ridge
X_AXIS = {"l2": "lambda (L2 weight)", "ridge": "kernel ridge lambda (x mean diagonal)"}
STAGES = {"coarse": "coarse grid", "full": "full catalogue"}


def searched(rows: list[dict]) -> tuple[str, dict] | None:
    """(the x parameter, the fit's record) of a fit that searched, or None (a fixed lambda,
    the popularity ranking, a blend)."""
    record = rows[0] if rows else {}
    grid = record.get("grid") or []
    scored = [g for g in grid if "validation" in g]
    x = next((k for k in X_AXIS if scored and k in scored[0]), None)
    return (x, record) if x is not None and len(scored) > 1 else None


def plot_searches(fits: list[tuple], out: Path) -> Path:
    """One row of panels per searched run of `fits` ((run, label, cfg, rows, metric) each);
    RunError where none searched: such a run has nothing to draw."""
    drawn = [(f, s) for f in fits if (s := searched(f[3])) is not None]
    others = [f"{f[1]}" for f in fits if searched(f[3]) is None]
    if not drawn:
        raise RunError(
            f"{', '.join(others)}: fitted in closed form with no search (a fixed setting, or "
            "a model with none), so no training curve and no search to draw; "
            "`vaecf info RUN` shows its settings and validation metrics"
        )
    panels = [
        [st for st in STAGES if any(g.get("stage", "full") == st for g in s[1]["grid"])]
        for _, s in drawn
    ]
    ncols = max(map(len, panels))
    plt = pyplot()
    fig, axes = plt.subplots(
        len(drawn), ncols, figsize=(7 * ncols, 4.6 * len(drawn)), squeeze=False,
        constrained_layout=True,
    )  # fmt: skip
    for row_axes, ((_, label, _, _, metric), (x, record)), stages in zip(axes, drawn, panels):
        for ax, stage in zip(row_axes, stages):
            _panel(ax, x, record, stage, metric, label)
        for ax in row_axes[len(stages) :]:
            ax.axis("off")
    title = f"validation search of {len(drawn)} closed-form run{'s' if len(drawn) > 1 else ''}"
    if others:
        title += f"\nnot drawn (no search): {', '.join(others)}"
    fig.suptitle(title, fontsize=13)
    out = save_figure(fig, out)
    plt.close(fig)
    return out


def _panel(ax, x: str, record: dict, stage: str, metric: str, label: str) -> None:
    """The stage's points, a line per (p, beta), the chosen point starred; under
    --selection cv the pooled validation and fold figure the choice compared."""
    from matplotlib.ticker import LogLocator

    pts = [g for g in record["grid"] if "validation" in g and g.get("stage", "full") == stage]
    pooled = any("cv" in g for g in pts)
    groups: dict[tuple, list] = {}
    for g in pts:
        y = g["value"] if pooled and "value" in g else g["validation"].get(metric)
        key = (g.get("dropout"), g.get("popularity_exponent"))
        groups.setdefault(key, []).append((g[x], y))
    varies = [len({k[i] for k in groups}) > 1 for i in (0, 1)]
    chosen = (record.get("dropout"), record.get("popularity_exponent"))  # None: not a choice
    for key, xy in sorted(groups.items(), key=lambda kv: tuple(v or 0 for v in kv[0])):
        xy.sort()
        name = ", ".join(f"{n} {v:g}" for n, v, on in zip(("p", "beta"), key, varies) if on)
        (line,) = ax.plot(*zip(*xy), marker="o", ms=4, lw=1.3, label=name or label)
        if stage == "full" and all(c is None or c == v for c, v in zip(chosen, key)):
            at = [y for v, y in xy if v == record.get(x)]
            if at:
                ax.plot([record[x]], at[:1], "*", ms=16, color=line.get_color(), mec="black")
    n_items = pts[0].get("n_items") if pts else None
    where = STAGES[stage] if pts and "stage" in pts[0] else "validation search"
    where += f", {n_items:,} items" if n_items else ""
    chose = f"chosen lambda {record[x]:g}" + "".join(
        f", {n} {v:g}" for n, v in zip(("p", "beta"), chosen) if v is not None
    )
    ax.set_title(f"{label}: {where}" + (f"\n{chose} (star)" if stage == "full" else ""))
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.set_xlabel(X_AXIS[x])
    ax.set_ylabel(f"{metric}, validation and cv folds pooled" if pooled else f"validation {metric}")
    ax.grid(alpha=0.3, which="both")
    if len(groups) > 1:
        ax.legend(fontsize=8, ncols=2 if len(groups) > 6 else 1, frameon=False)
