"""One way to declare settings: every option of every verb takes its default, its choices and
its help from a `setting()` declaration (vaecf.config.settings), or has none of them.

The rule the walk enforces, for every option of every (sub)parser of `vaecf.cli.build_parser()`:
- argparse holds no default (None; False for a hand-written switch): a default lives in the
  declaration and is filled in when the settings dataclass is built (`options.from_args`);
- "(default X)" ends the help of a declared option only, generated, with X its declaration's
  default (a registry dataset's own for `prepare NAME`); nothing else in any help names a literal
  default: no "(default ...)", "X (default)", "default 5", "default multvae" typed by hand, and
  no number equal to the option's default ("port (8000)");
- choices are a declaration's `Literal`, or registry names (models, datasets), never a list
  typed at the option.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, fields

import pytest

from vaecf.cli import build_parser
from vaecf.cli.options import add_settings, from_args
from vaecf.config import settings, specs
from vaecf.config.serve import ServeSettings
from vaecf.data import datasets
from vaecf.data.prepare import PROTOCOL_FIELDS, PrepareSettings

SKIP = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
LITERAL = re.compile(r"\(default\b|\bdefault\)|\bdefaults?:? (?:is |to )?['\"\d.-]")
NUMBER = re.compile(r"(?<![\w.@^$/-])\d[\d,]*(?:\.\d+)?(?![\w.:%])")


def walk(parser: argparse.ArgumentParser):
    """(prog, action) for every option and positional of `parser` and its subparsers."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases: once
                yield from walk(sub)
        elif not isinstance(action, SKIP):
            yield parser.prog, action


def declared(prog: str, action):
    """(field, the default its help must name) of a generated option, else None."""
    if not hasattr(action, "setting"):
        return None
    cls, name = action.setting
    f = {f.name: f for f in fields(cls)}[name]
    default = f.default if f.default is not MISSING else f.default_factory()
    words = prog.split()
    if cls is PrepareSettings and words[1:2] == ["prepare"] and words[2] in datasets.SPECS:
        own = {k: v for p in PROTOCOL_FIELDS.values() for k, v in p.items()}
        default = {**own, **datasets.SPECS[words[2]].defaults}.get(name, default)
    return f, default


def suffix(default) -> str:
    if default is None or default in ("", []):
        return ""
    return f" (default {','.join(map(str, default)) if isinstance(default, list) else default})"


def hand_written(help_text: str, choices, default) -> list[str]:
    """Literal defaults in (the hand-written part of) a help text."""
    found = LITERAL.findall(help_text)
    words = [str(c) for c in choices or ()] + ([default] if isinstance(default, str) else [])
    found += [w for w in words if w and re.search(rf"\bdefault:? {re.escape(w)}\b", help_text)]
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        found += [n for n in NUMBER.findall(help_text) if float(n.replace(",", "")) == default]
    return found


def from_registry(choices) -> bool:
    names = [str(c) for c in choices]
    return set(names) <= set(specs.SPECS) or names == datasets.names()


def problems(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for prog, a in walk(parser):
        where = f"{prog} {'/'.join(a.option_strings) or a.dest}"
        switch = isinstance(a, argparse._StoreTrueAction)
        if a.default not in (None, argparse.SUPPRESS) and not (switch and a.default is False):
            out.append(f"{where}: argparse default {a.default!r}, not from a declaration")
        decl = declared(prog, a)
        help_text, default = a.help or "", None
        if decl is not None:
            f, default = decl
            end = f.metadata["help"] + ("" if switch else suffix(default))
            if not help_text.endswith(end):
                out.append(f"{where}: help {help_text!r} is not its declaration's + {end!r}")
            help_text = help_text[: len(help_text) - len(end)] + f.metadata["help"]
            literal = settings.choices_of(settings.hints(a.setting[0])[f.name])
            if literal is not None and tuple(a.choices or ()) != literal:
                out.append(f"{where}: choices {a.choices} are not its Literal {literal}")
            elif literal is None and a.choices is not None and not from_registry(a.choices):
                out.append(f"{where}: choices {a.choices} typed at the option")
        elif a.choices is not None and not from_registry(a.choices):
            out.append(f"{where}: choices {a.choices} typed at the option, not declared")
        for text in hand_written(help_text, a.choices, default):
            out.append(f"{where}: help names a default by hand ({text!r}): {a.help!r}")
    return out


def test_every_option_takes_defaults_and_choices_from_a_declaration():
    assert problems(build_parser()) == []


def test_the_walk_sees_every_verb_and_the_generated_options():
    seen = {(prog, tuple(a.option_strings)): a for prog, a in walk(build_parser())}
    progs = {prog for prog, _ in seen}
    for verb in ("serve", "score", "train", "evaluate", "bench train", "bench infer", "demo"):
        assert f"vaecf {verb}" in progs
    assert {f"vaecf prepare {n}" for n in [*datasets.names(), "csv"]} <= progs
    assert hasattr(seen["vaecf serve", ("--port",)], "setting")
    assert hasattr(seen["vaecf prepare csv", ("--min-user-items",)], "setting")


def test_the_check_catches_hand_written_defaults_and_choices():
    p = argparse.ArgumentParser(prog="vaecf")
    sub = p.add_subparsers().add_parser("serve", prog="vaecf serve")
    sub.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    sub.add_argument("--device", help="cpu (default), cuda")
    sub.add_argument("--split", choices=["validation", "test"], help="default test")
    sub.add_argument("--level", choices=["a", "b"], help="a level")
    add_settings(sub, ServeSettings, only=("max_k",))["max_k"].help = "largest k (1000)"
    found = "\n".join(problems(p))
    for what in ("--port: argparse default 8000", "--device: help", "--split: help",
                 "--level: choices", "--max-k: help"):  # fmt: skip
        assert what in found, found


def test_shared_flags_are_declared_once():
    """Every --device is Compute's (auto) or Scoring's (cpu) declaration, with one help; every
    --precision offers a declared set (the training precisions or the serving ones, with or
    without auto): none can drift from the others."""
    shared = [*fields(settings.Compute), *fields(settings.Scoring)]
    sets = [set(settings.TRAIN_PRECISIONS), set(settings.SERVING_PRECISIONS)]
    devices = 0
    for prog, a in walk(build_parser()):
        if a.dest == "device":
            f = {f.name: f for f in fields(a.setting[0])}["device"]
            assert any(f is s for s in shared) and f.metadata["help"] == settings.DEVICE_HELP
            devices += 1
        if a.dest == "precision":
            assert set(a.choices) - {"auto"} in sets, (prog, a.choices)
    assert devices >= 10


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_serve_settings_are_built_from_the_options():
    a = parse("serve", "RUN")
    assert from_args(ServeSettings, a) == ServeSettings(run="RUN")
    a = parse(*"serve RUN --port 9 --request-timeout 5 --allowed-host a --allowed-host b".split(),
              "--no-auth", "--precision", "tf32", "--log-level", "debug")  # fmt: skip
    s = from_args(ServeSettings, a)
    assert (s.port, s.request_timeout_s, s.allowed_hosts) == (9, 5.0, ["a", "b"])
    assert (s.no_auth, s.precision, s.log_level, s.expose_paths) == (True, "tf32", "debug", False)


def test_unset_options_give_the_declared_defaults():
    from vaecf.cli.bench import BenchInfer, BenchTrain
    from vaecf.cli.serve import ScoreSettings

    assert from_args(ScoreSettings, parse("score", "R", "--input", "i", "--out", "o")).k == 100
    infer = from_args(BenchInfer, parse("bench", "infer"))
    assert (infer.target, infer.batch_size, infer.device, infer.precision) == (
        "20108",
        [1, 1024],
        "cpu",
        "auto",
    )
    assert from_args(BenchInfer, parse("bench", "infer", "--batch-size", "8")).batch_size == [8]
    t = from_args(BenchTrain, parse("bench", "train", "--precision", "fp32"))
    assert (t.precision, t.model, t.device, t.cuda_graphs) == (["fp32"], "multvae", "auto", True)
    csv = parse(*"prepare csv --path p --out o --heldout-users 3".split())
    assert from_args(PrepareSettings, csv) == PrepareSettings(heldout_users=3)


@pytest.mark.parametrize("argv", [["bench", "infer", "--precision", "tf32"]])
def test_bench_infer_accepts_every_serving_precision(argv):
    assert parse(*argv).precision == "tf32"


def test_prepare_settings_protocol_is_a_declared_literal():
    from vaecf.errors import DataError

    assert settings.choices_of(settings.hints(PrepareSettings)["protocol"]) == tuple(
        PROTOCOL_FIELDS
    )
    with pytest.raises(DataError, match="protocol= must be one of liang, thesis"):  # as before
        PrepareSettings(protocol="other").validate()
