"""A run directory from an untrained model, written through the rundir helpers: what load tests,
smoke tests and demos of the server need when no trained run is at hand (scores are those of
random weights: meaningless as recommendations, realistic in shape and cost)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from vaecf import models, rundir
from vaecf.data.vocab import Vocabulary
from vaecf.models.ease import EASE
from vaecf.version import __version__


def fresh_run(
    out: str | os.PathLike,
    n_items: int,
    model: str = "multvae",
    config: dict | None = None,
    item_ids: Sequence | None = None,
    seed: int = 0,
    epoch: int = 0,
) -> Path:
    """Write run directory `out` holding a freshly initialised `model` over `n_items` items
    (raw ids `item_ids`, default 0..n_items-1) as its best model; returns `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    net = models.build(model, n_items, config)
    for m in net.modules():  # EASE-family parts: an identity-free random item-item matrix
        if isinstance(m, EASE):
            m.weight = torch.randn(m.n_items, m.n_items).mul_(0.01).fill_diagonal_(0.0)
    if model == "popular":
        net.counts.uniform_(0.0, 100.0)
    ids = list(range(n_items)) if item_ids is None else list(item_ids)
    Vocabulary(ids).save(out / rundir.ITEMS)
    data = {"path": None, "fingerprint": None, "n_items": n_items, "n_train_users": 0}
    rundir.write_config(
        out, model, models.config_to_dict(net.config), {"untrained": True}, data, __version__
    )
    rundir.save_model(out, net, epoch=epoch, metrics={})
    counts = torch.randint(0, 100, (n_items,), generator=torch.Generator().manual_seed(seed))
    rundir.save_popularity(out, counts.numpy())  # made-up training counts (cold starts)
    return out
