"""TensorBoard scalars of a run, written from the trainer's `on_epoch` rows (optional extra)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from vaecf.errors import ConfigError

INSTALL = "pip install 'vaecf[tensorboard]'"
SUBDIR = "tensorboard"
TRAIN_KEYS = ("loss", "nll", "kl", "beta", "train_seconds", "users_per_s")


def require_tensorboard() -> None:
    """Refuse, saying how to install it, when the tensorboard package is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(f"--tensorboard needs the tensorboard package: {INSTALL}")


class TensorBoardLogger:
    """An `on_epoch` callback: train/* and validation/* scalars per epoch in RUN/tensorboard.
    The writer opens at the first epoch, once the trainer has made the run directory (it
    refuses to start in a directory that is not empty)."""

    def __init__(self, run_dir: str | os.PathLike):
        require_tensorboard()
        self.dir = Path(run_dir) / SUBDIR
        self.writer = None

    def __call__(self, row: dict) -> None:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.dir))
        epoch = int(row["epoch"])
        for k in TRAIN_KEYS:
            if isinstance(row.get(k), (int, float)):
                self.writer.add_scalar(f"train/{k}", row[k], epoch)
        for k, v in (row.get("validation") or {}).items():
            if not k.startswith("n_") and isinstance(v, (int, float)):
                self.writer.add_scalar(f"validation/{k}", v, epoch)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
