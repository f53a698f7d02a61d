"""Models behind one contract (models/base.py), by registry name: `--model NAME`. What each
model is (its settings and declaration) lives in vaecf.config.specs, which imports no torch; the
registry (models/registry.py) finds each class from its declaration. A model class or its
settings is here by name too (`vaecf.models.EASE`, `vaecf.models.EASEConfig`)."""

from __future__ import annotations

from vaecf.config.specs import SPECS, describe
from vaecf.models.base import Model, Phase
from vaecf.models.registry import MODELS, build, config_from_dict, config_to_dict, get

__all__ = [
    "MODELS",
    "Model",
    "Phase",
    "build",
    "config_from_dict",
    "config_to_dict",
    "describe",
    "get",
]


def __getattr__(name: str):
    """A declared model's class or settings dataclass, by its Python name."""
    for spec in SPECS.values():
        if spec.Config.__name__ == name:
            return spec.Config
        if spec.home.rpartition(":")[2] == name:
            return MODELS[spec.name]
    raise AttributeError(f"module 'vaecf.models' has no attribute {name!r}")
