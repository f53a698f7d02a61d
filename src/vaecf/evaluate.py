"""Fold-in evaluation: score held-out users from their fold-in items, rank the rest, compare
with their targets. Sparse throughout: target membership is a sorted-key search, no dense mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from vaecf.data.matrix import CSR, SparseBatch
from vaecf.errors import ConfigError
from vaecf.metrics import CATALOGUE, PER_USER, coverage, gini, parse_metric, ranking_metrics

DEFAULT_METRICS = ("recall@20", "recall@50", "ndcg@100")


def metrics_with(select_metric: str) -> tuple[str, ...]:
    """The reported metrics and the one a selection compares (`--select-metric`)."""
    return tuple(dict.fromkeys((*DEFAULT_METRICS, select_metric)))


ScoreFn = Callable[[SparseBatch], torch.Tensor]  # batch -> (B, n_items) scores
SCORE_BUDGET = 2**29  # bytes of float32 scores per evaluation batch: fewer users at 67k+ items


def _catalogue(metrics) -> list[tuple[str, int]]:
    """The catalogue metrics of `metrics` as (label, k), in order."""
    return [(m, parse_metric(m)[1]) for m in metrics if parse_metric(m)[0] in CATALOGUE]


def _batch_metrics(score_fn, fold_in, target, metrics, batch_size, rows, scales=(None,), info=None):
    """Yield, batch by batch of `rows`: (target sizes, [({metric: per-user values}, the top
    k_max items)] for each of `scales`: the scores with their columns multiplied by it, None:
    as they are), each batch scored once."""
    if fold_in.shape != target.shape:
        raise ConfigError(f"fold-in {fold_in.shape} and target {target.shape} differ in shape")
    n_items = fold_in.shape[1]
    k_max = min(max(parse_metric(m)[1] for m in metrics), n_items)
    tkeys = target.keys()
    n_target_all = target.row_nnz()
    batch_size = max(1, min(batch_size, SCORE_BUDGET // (4 * n_items)))  # sized by memory
    for part in rows.split(batch_size):
        batch = fold_in.batch(part)
        scores = score_fn(batch).float()
        scores[batch.row_ids, batch.indices] = -torch.inf  # never recommend fold-in items
        n_target = n_target_all[part]
        values = []
        for scale in scales:  # positive scales: the fold-in items stay at -inf
            top = (scores if scale is None else scores * scale).topk(k_max, dim=1).indices
            keys = part[:, None] * n_items + top  # (B, k_max) in rank order
            if tkeys.numel():
                pos = torch.searchsorted(tkeys, keys).clamp_max(tkeys.numel() - 1)
                hits = tkeys[pos] == keys
            else:
                hits = torch.zeros_like(keys, dtype=torch.bool)
            values.append((ranking_metrics(hits, n_target, metrics, top, info), top))
        yield n_target, values


def _sums(score_fn, fold_in, target, metrics, batch_size, rows, scales, info=None):
    """(len(scales), len(metrics) + 2 + n_items per catalogue metric) float64: `metric_sums`'
    sums under each column scale."""
    device, n_items = fold_in.device, fold_in.shape[1]
    rows = torch.arange(fold_in.n_rows, device=device) if rows is None else rows.to(device)
    cat = _catalogue(metrics)
    width = len(metrics) + 2 + n_items * len(cat)
    sums = torch.zeros(len(scales), width, dtype=torch.float64, device=device)
    batches = _batch_metrics(score_fn, fold_in, target, metrics, batch_size, rows, scales, info)
    zero = torch.zeros((), dtype=torch.float64, device=device)
    for n_target, values in batches:
        scored = n_target > 0
        for s, (v, top) in zip(sums, values):
            s[: len(metrics)] += torch.stack(
                [v[m][scored].sum() if m in v else zero for m in metrics]
            )
            for j, (_, k) in enumerate(cat):
                start = len(metrics) + 2 + j * n_items
                picks = top[scored, :k].reshape(-1)
                s[start : start + n_items] += torch.bincount(picks, minlength=n_items).double()
        sums[:, len(metrics)] += scored.sum()
    sums[:, len(metrics) + 1] = rows.numel()
    return sums


@torch.no_grad()
def metric_sums(
    score_fn: ScoreFn,
    fold_in: CSR,
    target: CSR,
    metrics: Sequence[str] = DEFAULT_METRICS,
    batch_size: int = 2000,
    rows: torch.Tensor | None = None,
    info: torch.Tensor | None = None,
) -> torch.Tensor:
    """float64: the per-metric sums over `rows` (default all) of users with a non-empty
    target, then the number of such users and the number of rows, then for each catalogue
    metric how often each item is in their top K. Sums, so that data-parallel ranks can
    all-reduce them. `info`: the items' self-information (novelty)."""
    return _sums(score_fn, fold_in, target, metrics, batch_size, rows, (None,), info)[0]


@torch.no_grad()
def evaluate_users(
    score_fn: ScoreFn, fold_in: CSR, target: CSR, metrics: Sequence[str], batch_size: int = 2000,
    info: torch.Tensor | None = None,
) -> tuple[dict, dict[str, torch.Tensor]]:  # fmt: skip
    """One pass over the users: (the summary `evaluate_scores` gives, each per-user metric's
    values: {"row": the rows of users with a non-empty target, metric: their values}, float64
    on the CPU, in row order; the summary's means are theirs)."""
    rows = torch.arange(fold_in.n_rows, device=fold_in.device)
    per_user = [m for m in metrics if parse_metric(m)[0] in PER_USER]
    cat = _catalogue(metrics)
    counts = {m: torch.zeros(fold_in.shape[1], dtype=torch.float64) for m, _ in cat}
    out: dict[str, list] = {"row": [], **{m: [] for m in per_user}}
    batches = _batch_metrics(score_fn, fold_in, target, metrics, batch_size, rows, info=info)
    start = 0
    for n_target, [(values, top)] in batches:
        scored = n_target > 0
        out["row"].append(torch.arange(start, start + n_target.numel())[scored.cpu()])
        start += n_target.numel()
        for m in per_user:
            out[m].append(values[m][scored].double().cpu())
        for m, k in cat:
            counts[m] += torch.bincount(top[scored, :k].reshape(-1).cpu(), minlength=len(counts[m]))
    per = {m: torch.cat(v) if v else torch.zeros(0, dtype=torch.float64) for m, v in out.items()}
    n_users = len(per["row"])
    summary = {m: float(per[m].mean()) if n_users else float("nan") for m in per_user}
    for m, _ in cat:
        summary[m] = coverage(counts[m]) if parse_metric(m)[0] == "coverage" else gini(counts[m])
    summary = {m: summary[m] for m in metrics}  # in the order asked
    summary.update(n_users=n_users, n_skipped=fold_in.n_rows - n_users)
    return summary, per


def per_user_values(
    score_fn: ScoreFn, fold_in: CSR, target: CSR, metrics: Sequence[str], batch_size: int = 2000,
    info: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """`evaluate_users`' per-user values of the per-user metrics of `metrics`."""
    per_user = [m for m in metrics if parse_metric(m)[0] in PER_USER]
    return evaluate_users(score_fn, fold_in, target, per_user, batch_size, info)[1]


def per_user_metric(
    score_fn: ScoreFn, fold_in: CSR, target: CSR, metric: str, batch_size: int = 2000
) -> torch.Tensor:
    """(n_users,) float64 on the CPU: `metric` of each user with a non-empty target, in row
    order, for paired comparisons."""
    return per_user_values(score_fn, fold_in, target, (metric,), batch_size)[metric]


def summarize(sums: torch.Tensor, metrics: Sequence[str] = DEFAULT_METRICS) -> dict:
    """Means from `metric_sums` (summed over ranks, if any), with n_users and n_skipped; a
    catalogue metric from its items' counts."""
    n = len(metrics)
    s = sums[: n + 2].tolist()
    n_users, n_rows = int(s[-2]), int(s[-1])
    out = {m: (v / n_users if n_users else float("nan")) for m, v in zip(metrics, s)}
    cat = _catalogue(metrics)
    if cat:
        n_items = (sums.numel() - n - 2) // len(cat)
        for j, (m, _) in enumerate(cat):
            counts = sums[n + 2 + j * n_items : n + 2 + (j + 1) * n_items]
            out[m] = coverage(counts) if parse_metric(m)[0] == "coverage" else gini(counts)
    out["n_users"] = n_users
    out["n_skipped"] = n_rows - n_users
    return out


def evaluate_scores(
    score_fn: ScoreFn,
    fold_in: CSR,
    target: CSR,
    metrics: Sequence[str] = DEFAULT_METRICS,
    batch_size: int = 2000,
    info: torch.Tensor | None = None,
) -> dict:
    """Mean of each metric over users with a non-empty target; `n_users` evaluated and
    `n_skipped` (users with an empty target) are reported beside them."""
    sums = metric_sums(score_fn, fold_in, target, metrics, batch_size, info=info)
    return summarize(sums, metrics)


@torch.no_grad()
def evaluate_scaled(
    score_fn: ScoreFn,
    scales: Sequence[torch.Tensor],
    fold_in: CSR,
    target: CSR,
    metrics: Sequence[str] = DEFAULT_METRICS,
    batch_size: int = 2000,
) -> list[dict]:
    """`evaluate_scores` of the scores with their columns multiplied by each of `scales`
    ((n_items,), positive), each batch scored once (a linear model's popularity penalties)."""
    sums = _sums(score_fn, fold_in, target, metrics, batch_size, None, list(scales))
    return [summarize(s, metrics) for s in sums]


def model_scores(model, precision: str = "fp32") -> ScoreFn:
    """Score function of a model of the contract (in eval mode), for its current weights."""
    return model.scorer(precision)


def evaluate_model(
    model,
    fold_in: CSR,
    target: CSR,
    metrics=DEFAULT_METRICS,
    batch_size: int = 2000,
    precision: str = "fp32",
    dist=None,
    info: torch.Tensor | None = None,
) -> dict:
    """Metrics of `model` (in eval mode); with a DistContext, each rank scores its share of the
    users and the sums are all-reduced. `info`: the items' self-information (novelty)."""
    was_training = model.training
    model.eval()
    try:
        rows = torch.arange(fold_in.n_rows, device=fold_in.device)
        if dist is not None and dist.enabled:
            rows = rows.tensor_split(dist.world)[dist.rank]
        sums = metric_sums(
            model_scores(model, precision), fold_in, target, metrics, batch_size, rows, info
        )
        if dist is not None:
            dist.all_reduce_sum(sums)
        return summarize(sums, metrics)
    finally:
        model.train(was_training)


def popularity_scores(train: CSR) -> ScoreFn:
    """The popularity baseline: every user gets the items' training counts as scores."""
    counts = torch.zeros(train.shape[1], device=train.device).index_add_(
        0, train.indices, torch.ones_like(train.values)
    )

    def fn(batch: SparseBatch) -> torch.Tensor:
        return counts.expand(batch.batch_size, -1).clone()

    return fn
