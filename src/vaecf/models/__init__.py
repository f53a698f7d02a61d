"""Models behind one contract (models/base.py), by registry name: `--model NAME`."""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields

from vaecf.errors import RunError
from vaecf.models.base import Model, Phase
from vaecf.models.blend import Auto, AutoConfig, Blend, BlendConfig
from vaecf.models.ease import EASE, EDLAE, EASEConfig, EDLAEConfig
from vaecf.models.hybrid import HybridConfig, RecVAEEDLAE
from vaecf.models.multvae import ModelConfig, MultDAE, MultVAE, build_model
from vaecf.models.popular import Popular, PopularConfig
from vaecf.models.recvae import RecVAE, RecVAEConfig

# The registry: adding a model is its module and one entry here.
MODELS: dict[str, type[Model]] = {
    m.name: m for m in (MultVAE, MultDAE, RecVAE, RecVAEEDLAE, EASE, EDLAE, Popular, Auto, Blend)
}

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


def describe() -> list[dict]:
    """Every registered model as declared: name, title, family, one line on what it is, and
    its settings (name, default, help). `vaecf models` prints it; the README's table is
    checked against it."""
    out = []
    for name, cls in MODELS.items():
        settings = []
        for f in fields(cls.Config):
            if f.name == "model":
                continue
            default = f.default if f.default is not MISSING else f.default_factory()
            settings.append(
                {"name": f.name, "default": default, "help": f.metadata.get("help", "")}
            )
        out.append(
            {
                "name": name,
                "title": cls.title or name,
                "family": cls.family,
                "summary": cls.summary,
                "settings": settings,
            }
        )
    return out
