"""`vaecf tune`'s search space: a model's declared space, the parameters a study fixes, and the
train and model settings a trial's parameters give."""

from __future__ import annotations

import json
from collections.abc import Callable

from vaecf import models
from vaecf.config import toml as configfile
from vaecf.errors import ConfigError

SpaceFn = Callable[[object, int], dict]


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("vaecf tune needs optuna: pip install optuna (or vaecf)") from None
    return optuna


def default_space(model: str) -> SpaceFn:
    """The model's declared search space; refuse models with nothing to tune."""
    cls = models.get(model)
    if cls.search_space.__func__ is models.Model.search_space.__func__:
        cls.search_space(None, 0)  # raises the model's ConfigError
    return cls.search_space


def settings_of(
    space: SpaceFn, params: dict, n_train_users: int, base, seed: int, fixed: dict | None = None
) -> tuple[dict, dict]:
    """(train, model) settings of a trial with parameters `params` (and the study's `fixed`
    ones): the base file's, then the space's, then the study's seed."""
    optuna = require_optuna()
    return trial_settings(space, optuna.trial.FixedTrial(params), n_train_users, base, seed, fixed)


def trial_settings(
    space: SpaceFn, trial, n_train_users: int, base, seed: int, fixed: dict | None = None
) -> tuple[dict, dict]:
    """(train, model) settings `trial` draws from `space` (the study's `fixed` parameters
    given, not drawn) over the base file's, with the study's seed."""
    drawn = space(_Fixed(trial, fixed or {}), n_train_users)
    return _merge(base, drawn, seed)


class _Fixed:
    """A trial whose `suggest_*` returns the study's fixed value for a fixed parameter (not
    searched, not recorded as a parameter) and asks the real trial otherwise."""

    def __init__(self, trial, fixed: dict):
        self._trial, self._fixed = trial, fixed

    def __getattr__(self, name: str):
        attr = getattr(self._trial, name)
        if not name.startswith("suggest_"):
            return attr

        def suggest(param: str, *args, **kwargs):
            if param in self._fixed:
                return self._fixed[param]
            return attr(param, *args, **kwargs)

        return suggest


def parse_fixed(items) -> dict:
    """`["epochs=40", "hidden_dim=0"]` -> {"epochs": 40, "hidden_dim": 0} (JSON values, else
    strings)."""
    out = {}
    for item in items or ():
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--fix takes NAME=VALUE (a search-space parameter), not {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out[name.strip()] = value
    return out


def check_fixed(space: SpaceFn, fixed: dict, n_train_users: int) -> None:
    """Refuse fixed names that are not parameters of the search space."""
    names: set[str] = set()

    class _Probe:
        def __getattr__(self, name):
            def suggest(param, *args, **kwargs):
                names.add(param)
                if name == "suggest_categorical":
                    return (args[0] if args else kwargs["choices"])[0]
                low = args[0] if args else kwargs["low"]
                return low

            return suggest

    space(_Probe(), n_train_users)
    wrong = sorted(set(fixed) - names)
    if wrong:
        raise ConfigError(
            f"--fix {', '.join(wrong)}: not a parameter of this search space; its parameters: "
            f"{', '.join(sorted(names))}"
        )


def _merge(base, drawn: dict, seed: int) -> tuple[dict, dict]:
    train = {**base.train, **drawn.get("train", {}), "seed": seed}
    return train, {**base.model_config, **drawn.get("model", {})}


def drew_all(space: SpaceFn, params: dict, fixed: dict, n_train_users: int) -> bool:
    """Whether `params` are a whole draw of the search space (it replays on them alone)."""
    try:
        settings_of(space, params, n_train_users, configfile.RunSettings(), 0, fixed)
    except (ValueError, KeyError):  # FixedTrial: a parameter the trial had not drawn yet
        return False
    return True
