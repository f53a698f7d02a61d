"""Declaring a setting once: `setting(default, help)` in a dataclass, its type the annotation.

The command line derives its options from these declarations (vaecf.cli.options), and
`validate_fields` checks the enumerations (`Literal` types) before any work starts. The settings
several verbs share (device, precision, model) are declared here, once.
"""

from __future__ import annotations

import contextvars
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

from vaecf.errors import ConfigError


def setting(default: Any = MISSING, help: str = "", *, factory=None, **cli) -> Any:
    """A dataclass field with its help text (shown by `--help`); `cli`: how its option differs
    from `--name VALUE` (flag="--other" or a positional name, action="store_true" or "append",
    nargs, metavar)."""
    meta = {"help": help, "cli": cli}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def choices_of(tp) -> tuple | None:
    """The allowed values of a Literal annotation (also inside Optional or list), else None."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return next(filter(None, map(choices_of, typing.get_args(tp))), None)


def flag(name: str) -> str:
    """A setting's command-line flag: `--name-with-dashes`."""
    return "--" + name.replace("_", "-")


# who reads vaecf's messages: "python" (keyword arguments) unless the command line, which sets
# "cli" while it runs (flags)
READER: contextvars.ContextVar[str] = contextvars.ContextVar("vaecf_reader", default="python")
UNSET = object()


def spelled(name: str, value: Any = UNSET, python: str | None = None) -> str:
    """A setting as the message's reader spells it: `--min-rating` on the command line,
    `min_rating=` in Python; with `value`, `--min-rating 4` or `min_rating=4` (a flag that is
    True alone: `--resume`, `resume=True`). `python`: Python's spelling where it is not
    that (`--no-header` is `header=False`)."""
    if READER.get() == "cli":
        return flag(name) + ("" if value is UNSET or value is True else f" {value}")
    return python or f"{name}=" + ("" if value is UNSET else repr(value))


def validate_fields(obj, error: type[Exception] = ConfigError) -> None:
    """Check every Literal-typed field of a settings dataclass against its choices."""
    for name, tp in hints(type(obj)).items():
        allowed = choices_of(tp)
        value = getattr(obj, name)
        if allowed is not None and value is not None and value not in allowed:
            raise error(
                f"{spelled(name)} must be one of {', '.join(map(str, allowed))}, not {value!r}"
            )


# what a model trains in (vaecf.precision), and what a trained one can be served and scored in
# (vaecf.models.serving): the same, and int8 item layers
TrainPrecision = Literal["fp32", "tf32", "bf16", "fp16"]
ServingPrecision = Literal[TrainPrecision, "int8"]
TRAIN_PRECISIONS, SERVING_PRECISIONS = map(typing.get_args, (TrainPrecision, ServingPrecision))
DEVICE_HELP = "cpu, cuda, cuda:N, or auto: cuda if present"


@dataclass
class Compute:
    """Where and in what precision training and evaluation compute (train, tune, bench)."""

    device: str = setting("auto", DEVICE_HELP)
    precision: Literal["auto", TrainPrecision] = setting(
        "auto",
        "numeric precision; auto: bf16 where the CPU/GPU computes it natively, else fp32; "
        "fp16 uses dynamic loss scaling",
    )


@dataclass
class Scoring:
    """Where and in what precision a trained model answers (serve, score, recommend)."""

    device: str = setting("cpu", DEVICE_HELP)
    precision: Literal["auto", ServingPrecision] = setting(
        "auto",
        "auto: the copy that answers fastest on this machine at the served batch sizes, among "
        "those whose top 10 agrees with fp32's (timed at start-up, then cached; printed); "
        "fp32: the scores the run was evaluated with; int8: the item-sized layers in int8 with "
        "one scale per item (Mult-VAE, Mult-DAE, RecVAE), a quarter of their fp32 bytes, held "
        "and read per call (the other layers stay in fp32, or bf16 on a CPU with native bf16)",
    )


@dataclass
class ModelChoice:
    """The model a verb trains or times: a registry name (choices from vaecf.config.specs.SPECS)."""

    model: str = setting("multvae", "`vaecf models` describes them")
