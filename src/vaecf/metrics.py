"""Ranking metrics, vectorised in torch on any device. A metric is spelled NAME@K.

Per user, from the top K in rank order (rel_r = 1 where rank r's item is a target, T the
user's targets; Recall and NDCG exactly as the paper's code):
    recall@K    = hits / min(K, |T|)
    ndcg@K      = DCG / IDCG, DCG = sum_r rel_r / log2(r + 1), IDCG the DCG of min(K, |T|) hits
    precision@K = hits / K
    map@K       = sum_r rel_r * precision@r / min(K, |T|)   (average precision, mean over users)
    mrr@K       = 1 / the rank of the first hit (0 without one)
    hit@K       = 1 where any of the top K is a target
    novelty@K   = mean over the top K of -log2(share of training users who have the item)
Over the scored users' lists together (catalogue metrics):
    coverage@K  = share of the catalogue in at least one user's top K
    gini@K      = Gini index of how often each catalogue item is in a top K (0: every item
                  equally often; 1: one item only)
Users with an empty target get no value: they are excluded by `n_target > 0` and counted by
the caller.
"""

from __future__ import annotations

import torch

from vaecf.errors import ConfigError


def discounts(k: int, device=None) -> torch.Tensor:
    """(k,) 1 / log2(r + 1) for ranks r = 1..k."""
    return 1.0 / torch.log2(torch.arange(2, k + 2, device=device, dtype=torch.float64))


def _relevant(n_target: torch.Tensor, k: int) -> torch.Tensor:
    return n_target.clamp(min=1, max=k).double()


def recall_at_k(hits: torch.Tensor, n_target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user Recall@k from `hits` (B, >=k) bool in rank order and `n_target` (B,).

    Users with no target get 0 here; use `n_target > 0` to drop them from averages.
    """
    h = hits[:, :k].sum(1).double()
    return torch.where(n_target > 0, h / _relevant(n_target, k), torch.zeros_like(h))


def ndcg_at_k(hits: torch.Tensor, n_target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user NDCG@k from `hits` (B, >=k) bool in rank order and `n_target` (B,)."""
    disc = discounts(k, hits.device)
    dcg = (hits[:, :k].double() * disc[: min(k, hits.shape[1])]).sum(1)
    ideal = torch.cumsum(disc, 0)[(n_target.clamp(min=1, max=k) - 1).long()]
    return torch.where(n_target > 0, dcg / ideal, torch.zeros_like(dcg))


def precision_at_k(hits: torch.Tensor, n_target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user Precision@k: hits in the top k over k (a list cut short by a small catalogue
    still counts k slots)."""
    return hits[:, :k].sum(1).double() / k


def map_at_k(hits: torch.Tensor, n_target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user average precision at k: precision@r summed over the ranks r of the hits, over
    min(k, |T|)."""
    h = hits[:, :k].double()
    ranks = torch.arange(1, h.shape[1] + 1, device=h.device, dtype=torch.float64)
    ap = (h * h.cumsum(1) / ranks).sum(1)
    return torch.where(n_target > 0, ap / _relevant(n_target, k), torch.zeros_like(ap))


def mrr_at_k(hits: torch.Tensor, n_target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user reciprocal rank of the first hit in the top k, 0 without one."""
    h = hits[:, :k]
    first = h.double().argmax(1).double() + 1.0
    return torch.where(h.any(1), 1.0 / first, torch.zeros_like(first))


def hit_at_k(hits: torch.Tensor, n_target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user 1.0 where any of the top k is a target."""
    return hits[:, :k].any(1).double()


ACCURACY = {
    "recall": recall_at_k,
    "ndcg": ndcg_at_k,
    "precision": precision_at_k,
    "map": map_at_k,
    "mrr": mrr_at_k,
    "hit": hit_at_k,
}
PER_USER = (*ACCURACY, "novelty")  # a value per user: means, slices, paired tests, selection
CATALOGUE = ("coverage", "gini")  # a value of all the scored users' lists together
NAMES = (*PER_USER, *CATALOGUE)


def parse_metric(label: str) -> tuple[str, int]:
    """'ndcg@100' -> ('ndcg', 100); ConfigError naming the metrics for anything else."""
    name, _, k = label.partition("@")
    if name not in NAMES or not k.isdigit() or int(k) < 1:
        raise ConfigError(
            f"unknown metric {label!r}: a metric is NAME@K with K >= 1 and NAME one of "
            f"{', '.join(NAMES)} (e.g. ndcg@100, map@10, coverage@20)"
        )
    return name, int(k)


def self_information(item_users: torch.Tensor, n_users: int) -> torch.Tensor:
    """(n_items,) float64 -log2 of each item's share of the `n_users` training users
    (`item_users`: how many have it; an item no one has counts as one)."""
    return -torch.log2(item_users.double().clamp(min=1) / max(int(n_users), 1))


def novelty_at_k(top: torch.Tensor, info: torch.Tensor, k: int) -> torch.Tensor:
    """Per-user mean self-information (`info`) of the top k items (`top`: (B, >=k) indices)."""
    return info[top[:, :k]].mean(1)


def coverage(counts: torch.Tensor) -> float:
    """Share of the items recommended at least once (`counts`: per item, over the users)."""
    return float((counts > 0).double().mean()) if counts.numel() else float("nan")


def gini(counts: torch.Tensor) -> float:
    """Gini index of `counts` over every item (those never recommended included):
    sum_i (2i - n - 1) c_(i) / (n sum c) with c sorted ascending, i = 1..n."""
    n, total = counts.numel(), float(counts.sum())
    if n == 0 or total == 0:
        return float("nan")
    c = counts.double().sort().values
    i = torch.arange(1, n + 1, dtype=torch.float64, device=c.device)
    return float(((2 * i - n - 1) * c).sum() / (n * total))


def ranking_metrics(
    hits: torch.Tensor, n_target: torch.Tensor, labels, top=None, info=None
) -> dict[str, torch.Tensor]:
    """Per-user values for each per-user label ('recall@20', 'map@10', 'novelty@20', ...);
    novelty needs the top indices (`top`) and the items' self-information (`info`)."""
    out = {}
    for label in labels:
        name, k = parse_metric(label)
        if name == "novelty":
            if info is None:
                raise ConfigError(f"{label} needs the items' training popularity")
            out[label] = novelty_at_k(top, info, k)
        elif name in ACCURACY:
            out[label] = ACCURACY[name](hits, n_target, k)
    return out
