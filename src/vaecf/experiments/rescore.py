"""Comparing runs by any metric (`vaecf compare --metrics`): every run's test split scored
again (vaecf.run_evaluation), each per-user metric also by history-length slice, and, where the
runs share one split (a time protocol has one), each model against the first user by user.
"""

from __future__ import annotations

from collections.abc import Sequence


def rescore(records: list, metrics: Sequence[str], device: str = "auto") -> list[str]:
    """Score every record's run (compare.Record) on its test split with `metrics` and
    add each per-user metric's mean by history-length slice ("map@10 [6-20]"); the keys to
    summarize: the metrics, then the slices every run has."""
    from vaecf.metrics import PER_USER, parse_metric
    from vaecf.run_evaluation import evaluate_run

    per_user = [m for m in metrics if parse_metric(m)[0] in PER_USER]
    sliced: list[list[str]] = []
    for r in records:
        ev = evaluate_run(r.run_dir, metrics=metrics, device=device)
        keys = {f"{m} [{row['slice']}]": row[m] for row in ev.slices for m in per_user}
        r.test = {**r.test, **{m: ev.summary[m] for m in metrics}, **keys}
        r.per_user = ev.per_user
        sliced.append(list(keys))
    common = [k for k in sliced[0] if all(k in ks for ks in sliced)] if sliced else []
    return [*metrics, *common]


def paired_by_user(records: list, metrics: Sequence[str], paired_row) -> list[dict]:
    """On one split (a time protocol has one): each label after the first against the first,
    user by user, for each per-user metric overall and by history-length slice; a row as
    `summarize`'s (`paired_row`) with n the users and the paired t-test over them."""
    import polars as pl

    from vaecf.run_evaluation import SLICES

    scored = [r for r in records if r.per_user is not None]
    if not scored or len({r.key for r in scored}) != 1:
        return []
    ref, rows = scored[0], []
    cols = [m for m in metrics if m in ref.per_user.columns]
    for r in scored[1:]:
        both = ref.per_user.join(r.per_user, on="user_id", suffix=":other")
        for name, lo, hi in (("all", 1, None), *SLICES):
            part = both.filter(pl.col("history") >= lo)
            part = part if hi is None else part.filter(pl.col("history") <= hi)
            if part.height < 2:
                continue
            for m in cols:
                mine, theirs = part[f"{m}:other"].to_list(), part[m].to_list()
                label = m if name == "all" else f"{m} [{name}]"
                rows.append(paired_row(r.label, label, mine, theirs, ref.label))
    return rows
