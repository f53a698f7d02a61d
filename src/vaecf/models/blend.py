"""Selection models: `blend`, a weighted mix of two fitted models' standardised scores, and
`auto`, the declaration behind `--model auto` (vaecf.auto runs the selection; its run
directory then holds the winner, which may be a blend).

A blend scores a history with each part, standardises each part's scores over the items (zero
mean, unit variance per user, so a linear model's X B and an autoencoder's logits are on one
scale) and returns `weight * z_first + (1 - weight) * z_second`. The weight is chosen on
validation by `--model auto`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vaecf.data.matrix import SparseBatch
from vaecf.errors import ConfigError
from vaecf.models.base import ANNEAL_SETTINGS, GRADIENT_SETTINGS, Model
from vaecf.settings import setting


@dataclass
class BlendConfig:
    parts: list[str] = setting(help="the two models' registry names", factory=list)
    configs: list[dict] = setting(help="the two models' settings", factory=list)
    weight: float = setting(0.5, "weight of the first part's standardised scores, in [0, 1]")

    def __post_init__(self) -> None:
        if len(self.parts) != 2 or len(self.configs) != 2:
            raise ConfigError("a blend has exactly two parts, each with its settings")
        if not 0.0 <= self.weight <= 1.0:
            raise ConfigError("the blend weight must be in [0, 1]")


def standardise(scores: torch.Tensor) -> torch.Tensor:
    """(B, n_items) scores -> zero mean and unit variance over each row's items."""
    scores = scores.float()
    mean = scores.mean(1, keepdim=True)
    std = scores.std(1, keepdim=True).clamp_min(1e-12)
    return (scores - mean) / std


class Blend(Model):
    name = "blend"
    title = "blend"
    family = "selection"
    summary = (
        "validation-weighted mix of two models' standardised scores (made by --model auto "
        "from the best linear and the best autoencoder)"
    )
    Config = BlendConfig
    closed_form = True
    trainable = False
    train_settings = ()

    def __init__(self, n_items: int, config: BlendConfig | None = None):
        if config is None:
            raise ConfigError("a blend is made by --model auto, from two fitted models")
        super().__init__(n_items, config)
        from vaecf import models

        self.parts = nn.ModuleList(
            models.build(n, n_items, c) for n, c in zip(config.parts, config.configs)
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


@dataclass
class AutoConfig:
    candidates: list[str] = setting(
        help="models to fit and compare on validation, cheapest first",
        factory=lambda: ["edlae", "multvae", "recvae"],
    )
    budget: float | None = setting(
        None,
        "seconds for the whole selection: a candidate not started when it is spent is skipped "
        "(and recorded as such); unset: no limit",
    )
    blend: bool = setting(
        True, "also try a validation-weighted blend of the best linear and best autoencoder"
    )
    margin_z: float = setting(
        1.645,
        "another candidate displaces the best linear one only when its per-user validation "
        "gain over it exceeds z standard errors (1.645: one-sided 95 percent); 0: the plain "
        "best on validation",
    )

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ConfigError("--candidates names no model")
        if self.budget is not None and self.budget <= 0:
            raise ConfigError("--budget must be a positive number of seconds")
        if not self.margin_z >= 0:
            raise ConfigError("--margin-z must be >= 0 (standard errors of the paired gain)")


class Auto(Model):
    """Not a model of its own: `--model auto` fits the candidates and keeps the best."""

    name = "auto"
    title = "auto"
    family = "selection"
    summary = (
        "fits the candidates that fit the machine (and --budget), keeps the best on "
        "validation, a blend of the best linear and best autoencoder included"
    )
    Config = AutoConfig
    closed_form = True
    train_settings = (*GRADIENT_SETTINGS, *ANNEAL_SETTINGS)  # passed on to the candidates
