"""Options derived from settings dataclasses (vaecf.settings): one declaration gives the flag,
its type, its choices and its help; what the user set explicitly is kept apart from defaults."""

from __future__ import annotations

import argparse
import typing
from dataclasses import MISSING, fields

from vaecf.settings import choices_of, hints


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(tp):
    """(element type, is_list) of an annotation such as `int | None` or `list[float]`."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], True
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return _base_type(args[0]) if len(args) == 1 else (str, False)
    return tp, False


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def _list_of(kind):
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {kind.__name__} values, not {text!r}"
            ) from None

    parse.__name__ = f"list of {kind.__name__}"
    return parse


def add_settings(
    group, cls, skip: tuple[str, ...] = (), note: str = "", seen: dict | None = None
) -> list[str]:
    """Add one option per field of dataclass `cls` (defaults None: an unset option is not
    given). `seen` maps names already added (shared by several classes) to their help.
    Returns the field names added."""
    added = []
    types = hints(cls)
    for f in fields(cls):
        if f.name in skip or (seen is not None and f.name in seen):
            continue
        kind, is_list = _base_type(types[f.name])
        choices = choices_of(types[f.name])
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore
        shown = ",".join(map(str, default)) if is_list else default
        help_text = f.metadata.get("help", "")
        if default is not None:
            help_text += f" (default {shown})"
        kw: dict = {"dest": f.name, "default": None, "help": note + help_text}
        if choices is not None:
            kw["choices"] = choices
        elif kind is bool:
            kw["type"], kw["metavar"] = _bool, "true|false"
        elif is_list:
            kw["type"], kw["metavar"] = _list_of(kind), "A,B,..."
        elif kind in (int, float, str):
            kw["type"] = kind
        group.add_argument(flag(f.name), **kw)
        added.append(f.name)
        if seen is not None:
            seen[f.name] = help_text
    return added


def given(args: argparse.Namespace, names) -> dict:
    """The options among `names` that the user set."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
