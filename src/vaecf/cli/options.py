"""Options derived from settings dataclasses (vaecf.config.settings): one declaration gives the
flag, its type, its choices and its help; what the user set explicitly is kept apart from
defaults."""

from __future__ import annotations

import argparse
import typing
from dataclasses import MISSING, fields

from vaecf.config.settings import choices_of, flag, hints


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


def shown(default, cli: dict) -> str:
    """The help's "(default X)": the declared default, unless there is none to show."""
    if default is None or default in ("", []) or cli.get("action") == "store_true":
        return ""
    return f" (default {','.join(map(str, default)) if isinstance(default, list) else default})"


def add_settings(group, cls, skip=(), note="", seen=None, only=None, defaults=None) -> dict:
    """Add one option per field of dataclass `cls` (or per name in `only`), with argparse
    default None: an unset option is not given, and `from_args` fills in the declared default.
    `seen` maps names already added (shared by several classes) to their help; `defaults`
    overrides the default the help names (a dataset's own). Returns {name: its action}."""
    added = {}
    types = hints(cls)
    for f in fields(cls):
        if f.name in skip or (only is not None and f.name not in only) or f.name in (seen or ()):
            continue
        kind, is_list = _base_type(types[f.name])
        cli = dict(f.metadata.get("cli", {}))
        name = cli.pop("flag", flag(f.name))
        if name != flag(f.name) and name.startswith("--") and kind is not bool:
            cli.setdefault("metavar", name[2:].replace("-", "_").upper())  # as the flag reads
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore
        help_text = f.metadata.get("help", "") + shown((defaults or {}).get(f.name, default), cli)
        kw: dict = {"default": None, "help": note + help_text, **cli}
        kw.update({"dest": f.name} if name.startswith("-") else {})
        if choices_of(types[f.name]) is not None:
            kw["choices"] = choices_of(types[f.name])
        elif kind is bool and "action" not in cli:
            kw["type"], kw["metavar"] = _bool, "true|false"
        elif is_list and "action" not in cli:
            kw["type"], kw["metavar"] = _list_of(kind), "A,B,..."
        elif kind in (int, float, str):
            kw["type"] = kind
        added[f.name] = group.add_argument(name, **kw)
        added[f.name].setting = (
            cls,
            f.name,
        )  # the declaration, for tests/config/test_settings_decl.py
        if seen is not None:
            seen[f.name] = help_text
    return added


def given(args: argparse.Namespace, names) -> dict:
    """The options among `names` that the user set."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def from_args(cls, args: argparse.Namespace, **extra):
    """`cls` built from the options it declares that the user set (the others: its defaults)."""
    return cls(**given(args, [f.name for f in fields(cls) if f.name not in extra]), **extra)


def add_columns_options(p) -> None:
    """How a raw interactions file's columns are found (prepare csv, compare --data, score)."""
    p.add_argument(
        "--user-col",
        help="the user id column (unset: found by name: user, userId, customer_id, reviewerID...)",
    )
    p.add_argument(
        "--item-col",
        help="the item id column (unset: found by name: item, movieId, product_id, asin, sku...)",
    )
    p.add_argument(
        "--rating-col",
        help="the rating column, which --min-rating reads (unset: a column named rating, score, "
        "stars...; without --min-rating, with --columns: one named rating)",
    )
    p.add_argument(
        "--sep",
        help="field separator: one character ('\\t' or tab, space), '::', or 'whitespace' for "
        "runs of spaces and tabs (unset: found in the file; ',' or tab for .tsv where the first "
        "line holds one)",
    )
    p.add_argument(
        "--no-header",
        action="store_true",
        help="the file has no header row: name its columns in order with --columns",
    )
    p.add_argument(
        "--columns",
        help="with --no-header: the columns' names in order, e.g. user,item,rating,timestamp",
    )
