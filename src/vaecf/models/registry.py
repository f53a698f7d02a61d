"""The registry: every declared model (vaecf.config.specs.SPECS) by name, its class imported from
the module its declaration names on first use. Adding a model is its module plus its declaration;
`MODELS`, `--model`, `vaecf models`, TOML and `vaecf.fit` all read the declarations."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, fields

from vaecf.config.specs import SPECS, Spec
from vaecf.errors import RunError


def model_class(spec: Spec) -> type:
    """The class that `spec.home` ("module:Class") names; it must carry that declaration."""
    module, _, name = spec.home.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if getattr(cls, "spec", None) is not spec:
        raise ImportError(f"{spec.home} does not declare spec {spec.name!r}")
    return cls


class Registry(Mapping):
    """name -> model class, in the declarations' order, live: a model declared after import
    (vaecf.config.specs.register) is here too."""

    def __getitem__(self, name: str) -> type:
        return model_class(SPECS[name])

    def __iter__(self) -> Iterator[str]:
        return iter(list(SPECS))

    def __len__(self) -> int:
        return len(SPECS)

    def __repr__(self) -> str:
        return f"MODELS({', '.join(self)})"


MODELS = Registry()


def get(name: str) -> type:
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


def build(name: str, n_items: int, config=None):
    """A fresh model `name` over `n_items` items with `config` (a dataclass, dict or None)."""
    cls = get(name)
    if config is None or isinstance(config, dict):
        config = config_from_dict(name, config)
    return cls(n_items, config)
