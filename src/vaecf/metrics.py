"""Ranking metrics exactly as the paper's code, vectorised in torch on any device.

Recall@K = hits in the top K / min(K, |target|).
NDCG@K = DCG / IDCG with DCG = sum over top-K ranks r (1-based) of rel / log2(r + 1) and IDCG
the DCG of min(K, |target|) hits. Users with an empty target get no value (NaN-free: they are
excluded by `valid` and counted by the caller).
"""

from __future__ import annotations

import torch

from vaecf.errors import ConfigError


def discounts(k: int, device=None) -> torch.Tensor:
    """(k,) 1 / log2(r + 1) for ranks r = 1..k."""
    return 1.0 / torch.log2(torch.arange(2, k + 2, device=device, dtype=torch.float64))


def recall_at_k(hits: torch.Tensor, n_target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user Recall@k from `hits` (B, >=k) bool in rank order and `n_target` (B,).

    Users with no target get 0 here; use `n_target > 0` to drop them from averages.
    """
    h = hits[:, :k].sum(1).double()
    denom = n_target.clamp(min=1, max=k).double()
    return torch.where(n_target > 0, h / denom, torch.zeros_like(h))


def ndcg_at_k(hits: torch.Tensor, n_target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user NDCG@k from `hits` (B, >=k) bool in rank order and `n_target` (B,)."""
    disc = discounts(k, hits.device)
    dcg = (hits[:, :k].double() * disc[: min(k, hits.shape[1])]).sum(1)
    ideal = torch.cumsum(disc, 0)[(n_target.clamp(min=1, max=k) - 1).long()]
    return torch.where(n_target > 0, dcg / ideal, torch.zeros_like(dcg))


def parse_metric(label: str) -> tuple[str, int]:
    """'ndcg@100' -> ('ndcg', 100)."""
    name, _, k = label.partition("@")
    if name not in ("recall", "ndcg") or not k.isdigit() or int(k) < 1:
        raise ConfigError(f"metric must look like 'recall@20' or 'ndcg@100', not {label!r}")
    return name, int(k)


def ranking_metrics(hits: torch.Tensor, n_target: torch.Tensor, labels) -> dict[str, torch.Tensor]:
    """Per-user values for each label ('recall@20', 'ndcg@100', ...)."""
    fns = {"recall": recall_at_k, "ndcg": ndcg_at_k}
    out = {}
    for label in labels:
        name, k = parse_metric(label)
        out[label] = fns[name](hits, n_target, k)
    return out
