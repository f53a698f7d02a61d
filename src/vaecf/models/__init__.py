"""Models behind one contract (models/base.py), by registry name: `--model NAME`. What each
model is (its settings and declaration) lives in vaecf.specs, which imports no torch."""

from __future__ import annotations

from dataclasses import asdict, fields

from vaecf.errors import RunError
from vaecf.models.base import Model, Phase
from vaecf.models.blend import Auto, AutoConfig, Blend, BlendConfig
from vaecf.models.ease import EASE, EDLAE, EASEConfig, EDLAEConfig
from vaecf.models.hybrid import HybridConfig, RecVAEEDLAE
from vaecf.models.infae import InfAE, InfAEConfig
from vaecf.models.multvae import ModelConfig, MultDAE, MultVAE, build_model
from vaecf.models.popular import Popular, PopularConfig
from vaecf.models.recvae import RecVAE, RecVAEConfig
from vaecf.specs import SPECS, describe

# The registry: adding a model is its module and one entry here.
MODELS: dict[str, type[Model]] = {
    m.name: m
    for m in (MultVAE, MultDAE, RecVAE, RecVAEEDLAE, InfAE, EASE, EDLAE, Popular, Auto, Blend)
}
if [m.spec for m in MODELS.values()] != list(SPECS.values()):  # a model added to one, not both
    raise ImportError("vaecf.models.MODELS and vaecf.specs.SPECS must list the same models")

__all__ = [
    "Auto",
    "AutoConfig",
    "Blend",
    "BlendConfig",
    "EASE",
    "EDLAE",
    "MODELS",
    "EASEConfig",
    "EDLAEConfig",
    "HybridConfig",
    "InfAE",
    "InfAEConfig",
    "RecVAEEDLAE",
    "Model",
    "ModelConfig",
    "MultDAE",
    "MultVAE",
    "Phase",
    "Popular",
    "PopularConfig",
    "RecVAE",
    "RecVAEConfig",
    "build",
    "build_model",
    "config_from_dict",
    "config_to_dict",
    "describe",
    "get",
]


def get(name: str) -> type[Model]:
    try:
        return MODELS[name]
    except KeyError:
        raise RunError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None


def config_from_dict(name: str, d: dict | None = None):
    """The model's config dataclass from a dict (unknown keys are an error)."""
    cls = get(name).Config
    d = dict(d or {})
    known = {f.name for f in fields(cls)}
    if "model" in known:  # a config shared by several models names which
        d["model"] = name
    extra = sorted(set(d) - known)
    if extra:
        raise RunError(
            f"{', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not a setting "
            f"of model {name}; its settings: {', '.join(sorted(known - {'model'}))}"
        )
    return cls(**d)


def config_to_dict(config) -> dict:
    d = asdict(config)
    d.pop("model", None)  # the registry name says it
    return d


def build(name: str, n_items: int, config=None) -> Model:
    """A fresh model `name` over `n_items` items with `config` (a dataclass, dict or None)."""
    cls = get(name)
    if config is None or isinstance(config, dict):
        config = config_from_dict(name, config)
    return cls(n_items, config)
