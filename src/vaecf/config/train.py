"""The training settings (`TrainConfig`), as dataclasses. Each setting is declared once, with
`setting()`: its type (the annotation), its default and its help; the command line's options and
their help are derived from the declarations, and `validate_fields` checks the enumerations
(`Literal` types) before any work starts.

Training settings left at None are resolved from the model and the data when a run starts
(`Model.resolve_train`) and recorded, resolved, in the run's config.json.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Literal

from vaecf.config.modelconfigs import ModelConfig
from vaecf.config.settings import Compute, setting, spelled, validate_fields
from vaecf.config.specs import ANNEAL_SETTINGS, GRADIENT_SETTINGS
from vaecf.errors import ConfigError

# Epochs without a better validation metric after which a gradient model stops (--preset auto).
# Mult-VAE against its 200 epochs (benchmarks/README.md, "Early stopping"): test NDCG@100
# +0.0001 on ml-latest-small (5 splits, none lower) at 48% of the epochs, +0.0012 on FilmTrust
# (5 splits) at 31%, +0.0000 on ML-1M (1 split) at 24%; 20 lost 0.0079 on one ml-latest-small
# split.
PATIENCE = 30
# ... counted in updates where an epoch holds many (a large set's epoch is 100+ updates, a
# 600-user set's 5): PATIENCE_UPDATES updates since the best, and at least MIN_PATIENCE epochs.
# Unchanged up to 50 updates an epoch (ml-latest-small, FilmTrust); ML-1M's Mult-VAE (49-54
# updates) gets 28-30, where 20 kept its best epoch on every split ("Early stopping"). RecVAE on
# ML-1M (4 x 52 updates an epoch): 10 epochs kept the best epoch of 50 on 3 of 3 splits, at 62%
# of the time; on a Pinterest-shaped set (45,000 training users: Mult-VAE 100 updates an epoch,
# RecVAE 400) 15 and 10 epochs stop both at the best epoch 30 found: auto 19.3 -> 12.0 min
# (benchmarks/README.md, "Early stopping" and "auto at Pinterest's shape").
PATIENCE_UPDATES = 1_500
MIN_PATIENCE = 10


def auto_patience(updates_per_epoch: int) -> int:
    """--preset auto's patience in epochs for a run of `updates_per_epoch` optimizer steps an
    epoch."""
    wanted = math.ceil(PATIENCE_UPDATES / max(1, updates_per_epoch))
    return max(MIN_PATIENCE, min(PATIENCE, wanted))


@dataclass
class TrainConfig(Compute):
    """How a model trains (its device and precision: `Compute`, shared with other verbs)."""

    preset: Literal["auto", "paper"] = setting(
        "auto",
        "auto: unset training settings fitted to the data (batch size, KL annealing length); "
        "paper: the model's published settings",
    )
    epochs: int | None = setting(None, "passes over the training users (Mult-VAE 200, RecVAE 50)")
    batch_size: int | None = setting(
        None,
        "users per update, the global batch (paper 500; auto: 500 from 50,000 training users, "
        "n/100 below, at least 100)",
    )
    lr: float | None = setting(
        None,
        "Adam learning rate (Mult-VAE 1e-3, RecVAE 5e-4; auto: x sqrt(batch / the auto batch) "
        "for batches above the auto batch)",
    )
    total_anneal_steps: int | None = setting(
        None,
        "Mult-VAE: updates for the KL weight to reach 1, beta = step / this (paper 200000; "
        "auto: beta reaches --anneal-cap after 85%% of the run's updates, as on ML-20M)",
    )
    anneal_cap: float | None = setting(None, "Mult-VAE: largest KL weight beta (paper 0.2)")
    seed: int = setting(98765, "seed of initialisation, shuffling, dropout and sampling")
    data_on: Literal["device", "host"] = setting(
        "device",
        "keep the training matrix on the device, or on the host with batches prefetched by a "
        "background thread (for data that does not fit)",
    )
    cuda_graphs: bool = setting(
        True,
        "on a GPU, replay each full batch's training step (gather, forward, backward, Adam) as "
        "a CUDA graph (one per phase): in one process at fp32, tf32 or bf16",
    )
    first_layer: Literal["auto", "bag", "gather", "csr", "dense"] = setting(
        "auto",
        "the sparse first layer's training kernel: auto times each on a batch of the run on a "
        "GPU and keeps the fastest (recorded in results.json), embedding_bag (bag) on a CPU",
    )
    eval_every: int = setting(1, "validate every N epochs (and after the last)")
    patience: int | None = setting(
        None,
        "stop when the validation metric has not improved for this many epochs; the best epoch "
        f"is kept (0: train every epoch; unset: 0 with --preset paper; with auto {PATIENCE}, or "
        f"{PATIENCE_UPDATES:,} optimizer steps where an epoch holds more than "
        f"{PATIENCE_UPDATES // PATIENCE}, at least {MIN_PATIENCE} epochs)",
    )
    budget: float | None = setting(
        None,
        "seconds for the whole run, a promise: training stops before an epoch that would end "
        "past it, keeping the best validated epoch (results.json says so); --model auto shares "
        "it among its candidates; unset: no limit",
    )
    checkpoint_every: float = setting(
        60.0,
        "seconds of training between writes of last.pt (written in the background; also after "
        "the last epoch and on SIGINT/SIGTERM); 0: after every epoch",
    )
    eval_batch_size: int = setting(
        2000, "users per evaluation batch (fewer where their scores would pass 512 MiB)"
    )
    select_metric: str = setting(
        "ndcg@100",
        "validation metric that picks the best model, epoch and setting: recall, ndcg, "
        "precision, map, mrr or hit @K",
    )
    progress: bool = setting(True, "progress bar and a line per validation")

    def validate(self) -> None:
        from vaecf.metrics import ACCURACY, parse_metric

        validate_fields(self)
        if self.patience is not None and self.patience < 0:
            raise ConfigError(f"{spelled('patience')} must be >= 0 epochs (0: no early stopping)")
        if self.budget is not None and not self.budget > 0:
            raise ConfigError(f"{spelled('budget')} must be a positive number of seconds")
        for name in ("epochs", "batch_size", "eval_every", "eval_batch_size", "total_anneal_steps"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{spelled(name)} must be at least 1")
        if not self.checkpoint_every >= 0:
            raise ConfigError(f"{spelled('checkpoint_every')} must be >= 0 seconds")
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"{spelled('lr')} must be positive")
        if self.anneal_cap is not None and not self.anneal_cap >= 0:
            raise ConfigError(f"{spelled('anneal_cap')} must be >= 0")
        try:
            name, _ = parse_metric(self.select_metric)
        except ValueError as e:
            raise ConfigError(f"{spelled('select_metric')} {e}") from None
        if name not in ACCURACY:
            raise ConfigError(
                f"{spelled('select_metric')} {self.select_metric}: a model is chosen by accuracy "
                f"({', '.join(ACCURACY)} @K); {name} describes the lists, not whether they are "
                "right (report it with vaecf evaluate --metrics)"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    def beta_at(self, step: int) -> float:
        """KL weight of update `step` (0-based): min(anneal_cap, step / total_anneal_steps)."""
        if self.total_anneal_steps is None:  # a model without KL annealing
            return 0.0
        return min(self.anneal_cap, step / self.total_anneal_steps)


def from_dict(cls, d: dict):
    """Build a config dataclass from a dict, ignoring unknown keys (forward compatibility)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


__all__ = [
    "ANNEAL_SETTINGS",
    "GRADIENT_SETTINGS",
    "ModelConfig",
    "TrainConfig",
    "from_dict",
    "setting",
]
