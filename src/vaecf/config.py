"""Settings as dataclasses, each field with its meaning; the paper's hyperparameters by default."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from vaecf.data.prepare import PrepareSettings
from vaecf.models.multvae import ModelConfig

__all__ = ["ModelConfig", "PrepareSettings", "TrainConfig", "from_dict"]


@dataclass
class TrainConfig:
    epochs: int = 200  # passes over the training users
    batch_size: int = 500  # users per update (global batch)
    lr: float = 1e-3  # Adam learning rate
    total_anneal_steps: int = 200_000  # updates until beta would reach 1 (beta = step / this)
    anneal_cap: float = 0.2  # largest beta (KL weight)
    seed: int = 98765  # initialisation, shuffling, dropout and sampling
    device: str = "auto"  # "auto" (cuda if present), "cpu", "cuda", "cuda:N"
    precision: str = "auto"  # "auto" (bf16 where native, else fp32), "fp32", "tf32", "bf16", "fp16"
    data_on: str = "device"  # training matrix on the "device", or on the "host" (prefetched)
    eval_every: int = 1  # validate every this many epochs (and after the last)
    eval_batch_size: int = 2000  # users per evaluation batch
    select_metric: str = "ndcg@100"  # validation metric that picks the best model
    progress: bool = True  # progress bar and a line per validation

    def validate(self) -> None:
        for name in ("epochs", "batch_size", "eval_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.data_on not in ("device", "host"):
            raise ValueError(f"--data-on must be 'device' or 'host', not {self.data_on!r}")
        if self.lr <= 0:
            raise ValueError("--lr must be positive")
        if self.total_anneal_steps < 1:
            raise ValueError("--total-anneal-steps must be at least 1")
        if not 0.0 <= self.anneal_cap:
            raise ValueError("--anneal-cap must be >= 0")

    def to_dict(self) -> dict:
        return asdict(self)


def from_dict(cls, d: dict):
    """Build a config dataclass from a dict, ignoring unknown keys (forward compatibility)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})
