"""EASE (Steck, WWW 2019) and the popularity baseline: closed-form models in the same contract.

EASE: P = (X^T X + lambda I)^-1, B = I - P diagMat(1 / diag(P)) (so diag(B) = 0), scores = X B.
lambda is chosen on the validation split from a log grid unless given. The solve is a Cholesky
factorisation and inverse of the regularised Gram matrix on the run's device.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from vaecf.data.matrix import SparseBatch
from vaecf.errors import ConfigError, RunError
from vaecf.models.base import Model
from vaecf.settings import setting, validate_fields

DEFAULT_GRID = [1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0]


@dataclass
class EASEConfig:
    l2: float | None = setting(
        None, "lambda, the L2 weight; unset: the best of --l2-grid on validation NDCG@100"
    )
    l2_grid: list[float] = setting(
        help="lambdas to try when --l2 is unset", factory=lambda: list(DEFAULT_GRID)
    )
    solve_dtype: Literal["float32", "float64"] = setting(
        "float32", "dtype of the solve (float32 is ample for lambda >= 1)"
    )

    def __post_init__(self) -> None:
        if self.l2 is not None and self.l2 <= 0:
            raise ConfigError("l2 (lambda) must be positive")
        if not self.l2_grid or min(self.l2_grid) <= 0:
            raise ConfigError("l2_grid must hold positive values")
        validate_fields(self)


def _sparse_rows(table: torch.Tensor, batch: SparseBatch) -> torch.Tensor:
    """(B, d) sum over each history of value x the item's row of `table`."""
    return F.embedding_bag(
        batch.indices,
        table,
        batch.offsets,
        mode="sum",
        per_sample_weights=batch.values.to(table.dtype),
    )


def available_bytes(device: torch.device) -> int:
    """Memory free for new arrays on `device` (MemAvailable on the host)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_memory(n_items: int, dtype: torch.dtype, device: torch.device, copies: int) -> int:
    """Refuse, with the figures and what to do, when `copies` n_items^2 arrays do not fit."""
    need = copies * n_items * n_items * torch.empty((), dtype=dtype).element_size()
    free = available_bytes(device)
    if need > free:
        raise RunError(
            f"EASE on {n_items:,} items needs about {need / 2**30:.1f} GiB "
            f"({copies} arrays of {n_items:,}^2 {str(dtype).removeprefix('torch.')}) but "
            f"{device} has {free / 2**30:.1f} GiB free; drop rare items when preparing "
            "(--min-item-users), solve in float32, or use a device with more memory"
        )
    return need


def ease_weights(gram: torch.Tensor, l2: float) -> torch.Tensor:
    """B for one lambda from the Gram matrix X^T X (not modified)."""
    a = gram.clone()
    a.diagonal().add_(l2)
    chol, info = torch.linalg.cholesky_ex(a)
    if int(info):
        raise RunError(f"X^T X + {l2} I is not positive definite here; use a larger --l2")
    p = torch.cholesky_inverse(chol, out=a)  # (n_items, n_items), reuses a's memory
    del chol
    b = p.div_(-p.diagonal().clone())  # -P / diag(P), column-wise
    b.diagonal().zero_()  # I - P diag(1/diag P): the diagonal cancels exactly
    return b


class EASE(Model):
    name = "ease"
    title = "EASE"
    Config = EASEConfig
    closed_form = True

    @classmethod
    def search_space(cls, trial, n_train_users: int) -> dict[str, dict]:
        """lambda, log-uniform over 1 to 30,000 (one solve per trial)."""
        return {"train": {}, "model": {"l2": trial.suggest_float("l2", 1.0, 3e4, log=True)}}

    def __init__(self, n_items: int, config: EASEConfig | None = None):
        super().__init__(n_items, config)
        self.register_buffer("weight", torch.zeros(n_items, n_items))  # B (n_items, n_items)
        self.register_buffer("l2", torch.tensor(float("nan"), dtype=torch.float64))

    def scores(self, batch: SparseBatch) -> torch.Tensor:
        return _sparse_rows(self.weight, batch)  # (B, n_items) = X_batch B

    def item_vectors(self) -> torch.Tensor:
        """Rows of B: item j's weights for predicting every other item."""
        return self.weight

    def fit(
        self,
        train: sp.csr_matrix,
        validate: Callable[[Model], dict] | None = None,
        select_metric: str = "ndcg@100",
        log: Callable[[str], None] | None = None,
    ) -> dict:
        """Fit B on the training matrix; with no `l2` set, try each grid value, scoring the
        model with `validate` (-> validation metrics), and keep the best. Returns what to
        record: the lambda, the grid with each value's metrics, seconds, the solve's dtype."""
        cfg, device = self.config, self.weight.device
        dtype = getattr(torch, cfg.solve_dtype)
        grid = [cfg.l2] if cfg.l2 is not None else sorted(cfg.l2_grid)
        copies = 3 if len(grid) == 1 else 4  # gram, factor/inverse, B (+ the best B so far)
        check_memory(self.n_items, dtype, device, copies)
        t0 = time.perf_counter()
        x = train.tocsr().astype(np.float64 if dtype == torch.float64 else np.float32)
        gram = torch.from_numpy((x.T @ x).toarray()).to(device)  # (n_items, n_items)
        t_gram = time.perf_counter() - t0
        tried, best = [], None
        for l2 in grid:
            t1 = time.perf_counter()
            b = ease_weights(gram, l2)
            self.weight = b.to(torch.float32)
            row = {"l2": l2, "solve_seconds": round(time.perf_counter() - t1, 3)}
            if validate is not None:
                row["validation"] = validate(self)
                if log:
                    value = row["validation"][select_metric]
                    log(f"EASE lambda {l2:g}: {select_metric} {value:.4f}")
            tried.append(row)
            value = row["validation"][select_metric] if validate is not None else 0.0
            if best is None or value > best[0]:
                best = (value, l2, self.weight if len(grid) == 1 else self.weight.clone())
            del b
        del gram
        _, l2, self.weight = best
        self.l2 = torch.tensor(l2, dtype=torch.float64)
        return {
            "l2": l2,
            "grid": tried if len(grid) > 1 else None,
            "gram_seconds": round(t_gram, 3),
            "seconds": round(time.perf_counter() - t0, 3),
            "solve_dtype": str(dtype).removeprefix("torch."),
            "device": str(device),
        }


@dataclass
class PopularConfig:
    pass


class Popular(Model):
    """Every user gets the items' training counts: the floor of every comparison."""

    name = "popular"
    title = "popularity"
    Config = PopularConfig
    closed_form = True

    def __init__(self, n_items: int, config: PopularConfig | None = None):
        super().__init__(n_items, config)
        self.register_buffer("counts", torch.zeros(n_items))

    def scores(self, batch: SparseBatch) -> torch.Tensor:
        return self.counts.expand(batch.batch_size, -1).clone()

    def item_vectors(self) -> torch.Tensor:
        raise RunError("the popularity model has no notion of similar items; use another model")

    def fit(self, train: sp.csr_matrix, validate=None, select_metric="ndcg@100", log=None) -> dict:
        counts = np.asarray(train.getnnz(axis=0), dtype=np.float32)
        self.counts = torch.from_numpy(counts).to(self.counts.device)
        return {}
