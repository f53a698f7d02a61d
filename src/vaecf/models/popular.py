"""The popularity baseline: every user gets the items' training counts, the floor of every
comparison (and the ranking a new user with no known history falls back to)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from vaecf.config import specs
from vaecf.config.modelconfigs import PopularConfig
from vaecf.data.matrix import SparseBatch
from vaecf.errors import RunError
from vaecf.models.base import Model


class Popular(Model):
    spec = specs.POPULAR

    def __init__(self, n_items: int, config: PopularConfig | None = None):
        super().__init__(n_items, config)
        self.register_buffer("counts", torch.zeros(n_items))

    def scores(self, batch: SparseBatch) -> torch.Tensor:
        return self.counts.expand(batch.batch_size, -1).clone()

    def dense_scores(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1] * 0.0 + self.counts  # (B, n_items): the counts for every row

    def item_vectors(self) -> torch.Tensor:
        raise RunError("the popularity model has no notion of similar items; use another model")

    def fit(
        self,
        train: sp.csr_matrix,
        validate=None,
        select_metric="ndcg@100",
        log=None,
        validation=None,
        fold_in=None,
        deadline=None,
    ) -> dict:
        counts = np.asarray(train.getnnz(axis=0), dtype=np.float32)
        self.counts = torch.from_numpy(counts).to(self.counts.device)
        return {}
