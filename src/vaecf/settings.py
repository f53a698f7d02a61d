"""Declaring a setting once: `setting(default, help)` in a dataclass, its type the annotation.

The command line derives its options from these declarations (vaecf.cli.options), and
`validate_fields` checks the enumerations (`Literal` types) before any work starts.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, field
from typing import Any, Literal

from vaecf.errors import ConfigError


def setting(default: Any = MISSING, help: str = "", *, factory=None) -> Any:
    """A dataclass field with its help text (shown by `--help`)."""
    meta = {"help": help}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def choices_of(tp) -> tuple | None:
    """The allowed values of a Literal (or Optional Literal) annotation, else None."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return None


def validate_fields(obj) -> None:
    """Check every Literal-typed field of a settings dataclass against its choices."""
    for name, tp in hints(type(obj)).items():
        allowed = choices_of(tp)
        value = getattr(obj, name)
        if allowed is not None and value is not None and value not in allowed:
            raise ConfigError(
                f"--{name.replace('_', '-')} must be one of {', '.join(map(str, allowed))}, "
                f"not {value!r}"
            )


# what a model trains in (vaecf.precision), and what a trained one can be served and scored in
# (vaecf.models.serving): the same, and int8 item layers
TRAIN_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
SERVING_PRECISIONS = (*TRAIN_PRECISIONS, "int8")
