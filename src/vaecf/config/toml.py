"""Run settings as TOML: the file `vaecf train --config` reads and every run writes (config.toml).

    # comments are allowed
    data = "/path/to/prepared"   # optional: the prepared dataset (--data overrides it)
    [train]                      # TrainConfig settings (vaecf.config)
    epochs = 200
    lr = 0.001
    [model]
    name = "multvae"             # a registry name (vaecf.models.MODELS)
    hidden_dims = [600]          # the model's own Config settings

TOML cannot hold both a key `model` and a table `[model]`, so the model's name is `name` inside
[model]; a file without model settings may say `model = "popular"` at the top instead. Settings
left out are unset (TOML has no null): the defaults, or resolved from the data at the start of a
run. Unknown tables and keys are errors that list what is allowed. This module owns the format
only; it imports no training code.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from vaecf.errors import ConfigError

CONFIG_TOML = "config.toml"
# TrainConfig fields that describe the session, not the run: never read from or written to TOML.
NOT_IN_FILE = ("progress",)


@dataclass
class RunSettings:
    """What a TOML file sets: the model name, its settings, the training settings, the data."""

    model: str | None = None
    train: dict = field(default_factory=dict)
    model_config: dict = field(default_factory=dict)
    data: str | None = None


def _train_fields() -> set[str]:
    from vaecf.config.train import TrainConfig

    return {f.name for f in fields(TrainConfig)} - set(NOT_IN_FILE)


def loads(text: str, source: str = "<string>") -> RunSettings:
    """Parse and check a settings file's text (`source` names it in errors)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source} is not valid TOML ({e}); fix the line it names") from None
    model = doc.pop("model", None)
    model_table: dict = {}
    name = None
    if isinstance(model, dict):
        model_table = dict(model)
        name = model_table.pop("name", None)
    else:
        name = model
    data = doc.pop("data", None)
    train = doc.pop("train", {})
    if doc:
        raise ConfigError(
            f'{source}: unknown {", ".join(sorted(doc))}; a settings file has data = "PATH" '
            '(optional), a [train] table and a [model] table with name = "NAME"'
        )
    if name is not None and not isinstance(name, str):
        raise ConfigError(f'{source}: model must be a name such as "multvae"')
    if data is not None and not isinstance(data, str):
        raise ConfigError(f"{source}: data must be a path (a string)")
    if not isinstance(train, dict) or not isinstance(model_table, dict):
        raise ConfigError(f"{source}: [train] and [model] must be tables")
    known = _train_fields()
    extra = sorted(set(train) - known)
    if extra:
        raise ConfigError(
            f"{source}: [train] {', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not a "
            f"training setting; the settings: {', '.join(sorted(known))}"
        )
    return RunSettings(model=name, train=dict(train), model_config=dict(model_table), data=data)


def read(path: str | os.PathLike) -> RunSettings:
    """Read a settings file; the model's own settings are checked when the config is built."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; pass --config a TOML settings file")
    return loads(path.read_text(), str(path))


def _clean(d: dict) -> dict:
    """Drop unset (None) values, which TOML cannot hold and which mean 'default' anyway (also
    inside nested settings: a blend's parts)."""

    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x is not None}
        return [clean(x) for x in v] if isinstance(v, list) else v

    return {k: clean(v) for k, v in d.items() if v is not None and k not in NOT_IN_FILE}


def dumps(
    model: str,
    train: dict,
    model_config: dict,
    data: str | None = None,
    header: str = "",
) -> str:
    """The settings as TOML text, with `header` as leading comment lines."""
    import tomli_w

    body = tomli_w.dumps({"data": data}) + "\n" if data is not None else ""
    body += "[train]\n" + tomli_w.dumps(_clean(train))
    body += "\n[model]\n" + tomli_w.dumps({"name": model, **_clean(model_config)})
    lines = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    return lines + body


def write(path: str | os.PathLike, *args, **kwargs) -> None:
    """Write `dumps(*args, **kwargs)` to `path` atomically."""
    from vaecf.storage.safewrite import atomic_file

    with atomic_file(path, "w") as f:
        f.write(dumps(*args, **kwargs))
