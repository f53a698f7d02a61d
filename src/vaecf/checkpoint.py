"""Checkpoints: atomic writes, `weights_only=True` loads, clear errors for broken files."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from vaecf._io import atomic_file
from vaecf.errors import RunError

MAGIC = "vaecf-checkpoint-1"


def save(path: str | os.PathLike, payload: dict) -> None:
    with atomic_file(path) as f:
        torch.save({"magic": MAGIC, **payload}, f)


def load(path: str | os.PathLike, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise RunError(f"checkpoint {path} is missing; is this a finished vaecf run directory?")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise RunError(
            f"checkpoint {path} is corrupted or not a vaecf checkpoint ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); restore it or retrain the run"
        ) from None
    if not isinstance(obj, dict) or obj.get("magic") != MAGIC:
        raise RunError(f"{path} is not a vaecf checkpoint; retrain the run")
    return obj
