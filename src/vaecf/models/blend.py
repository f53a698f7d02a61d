"""Selection models: `blend`, a weighted mix of two fitted models' standardised scores, and
`auto`, the declaration behind `--model auto` (vaecf.training.auto runs the selection; its run
directory then holds the winner, which may be a blend).

A blend scores a history with each part, standardises each part's scores over the items (zero
mean, unit variance per user, so a linear model's X B and an autoencoder's logits are on one
scale) and returns `weight * z_first + (1 - weight) * z_second`. The weight is chosen on
validation by `--model auto`.
"""

from __future__ import annotations

import torch
from torch import nn

from vaecf.config import specs
from vaecf.config.modelconfigs import BlendConfig
from vaecf.data.matrix import SparseBatch
from vaecf.errors import ConfigError
from vaecf.models.base import Model
from vaecf.models.registry import build


def standardise(scores: torch.Tensor) -> torch.Tensor:
    """(B, n_items) scores -> zero mean and unit variance over each row's items."""
    scores = scores.float()
    mean = scores.mean(1, keepdim=True)
    std = scores.std(1, keepdim=True).clamp_min(1e-12)
    return (scores - mean) / std


class Blend(Model):
    spec = specs.BLEND

    def __init__(self, n_items: int, config: BlendConfig | None = None):
        if config is None:
            raise ConfigError("a blend is made by --model auto, from two fitted models")
        super().__init__(n_items, config)
        self.parts = nn.ModuleList(
            build(n, n_items, c) for n, c in zip(config.parts, config.configs)
        )

    def scores(self, batch: SparseBatch) -> torch.Tensor:
        w = self.config.weight
        first, second = (standardise(p.scores(batch)) for p in self.parts)
        return first.mul_(w).add_(second, alpha=1.0 - w)  # (B, n_items)

    def dense_scores(self, x: torch.Tensor) -> torch.Tensor:
        w = self.config.weight
        first, second = (standardise(p.dense_scores(x)) for p in self.parts)
        return w * first + (1.0 - w) * second

    def item_vectors(self) -> torch.Tensor:
        """The first part's (the linear model's, in an auto blend)."""
        return self.parts[0].item_vectors()

    def fit(self, train, validate=None, select_metric="ndcg@100", log=None, **_) -> dict:
        raise ConfigError("a blend is made by --model auto, not trained on its own")


class Auto(Model):
    """Not a model of its own: `--model auto` fits the candidates and keeps the best."""

    spec = specs.AUTO
