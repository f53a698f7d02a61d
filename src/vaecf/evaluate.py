"""Fold-in evaluation: score held-out users from their fold-in items, rank the rest, compare
with their targets. Sparse throughout: target membership is a sorted-key search, no dense mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from vaecf import precision as prec
from vaecf.data.matrix import CSR, SparseBatch
from vaecf.metrics import parse_metric, ranking_metrics

DEFAULT_METRICS = ("recall@20", "recall@50", "ndcg@100")

ScoreFn = Callable[[SparseBatch], torch.Tensor]  # batch -> (B, n_items) scores


@torch.no_grad()
def evaluate_scores(
    score_fn: ScoreFn,
    fold_in: CSR,
    target: CSR,
    metrics: Sequence[str] = DEFAULT_METRICS,
    batch_size: int = 2000,
) -> dict[str, float]:
    """Mean of each metric over users with a non-empty target; `n_users` evaluated and
    `n_skipped` (users with an empty target) are reported beside them."""
    if fold_in.shape != target.shape:
        raise ValueError(f"fold-in {fold_in.shape} and target {target.shape} differ in shape")
    n_rows, n_items = fold_in.shape
    device = fold_in.device
    k_max = min(max(parse_metric(m)[1] for m in metrics), n_items)
    tkeys = target.keys()
    n_target_all = target.row_nnz()
    sums = {m: torch.zeros((), dtype=torch.float64, device=device) for m in metrics}
    for lo in range(0, n_rows, batch_size):
        rows = torch.arange(lo, min(lo + batch_size, n_rows), device=device)
        batch = fold_in.batch(rows)
        scores = score_fn(batch).float()
        scores[batch.row_ids, batch.indices] = -torch.inf  # never recommend fold-in items
        top = scores.topk(k_max, dim=1).indices  # (B, k_max) in rank order
        keys = rows[:, None] * n_items + top
        if tkeys.numel():
            pos = torch.searchsorted(tkeys, keys).clamp_max(tkeys.numel() - 1)
            hits = tkeys[pos] == keys
        else:
            hits = torch.zeros_like(keys, dtype=torch.bool)
        for m, v in ranking_metrics(hits, n_target_all[rows], metrics).items():
            sums[m] += v.sum()
    n_users = int((n_target_all > 0).sum())
    out = {m: (float(s) / n_users if n_users else float("nan")) for m, s in sums.items()}
    out["n_users"] = n_users
    out["n_skipped"] = n_rows - n_users
    return out


def model_scores(model: torch.nn.Module, precision: str = "fp32") -> ScoreFn:
    """Score function of a model in eval mode (z = mu, no dropout)."""
    device = next(model.parameters()).device

    def fn(batch: SparseBatch) -> torch.Tensor:
        with prec.autocast(device, precision):
            return model(batch)[0]

    return fn


def evaluate_model(model, fold_in: CSR, target: CSR, metrics=DEFAULT_METRICS,
                   batch_size: int = 2000, precision: str = "fp32") -> dict[str, float]:
    was_training = model.training
    model.eval()
    try:
        return evaluate_scores(model_scores(model, precision), fold_in, target, metrics, batch_size)
    finally:
        model.train(was_training)


def popularity_scores(train: CSR) -> ScoreFn:
    """The popularity baseline: every user gets the items' training counts as scores."""
    counts = torch.zeros(train.shape[1], device=train.device).index_add_(
        0, train.indices, torch.ones_like(train.values))

    def fn(batch: SparseBatch) -> torch.Tensor:
        return counts.expand(batch.batch_size, -1).clone()

    return fn
