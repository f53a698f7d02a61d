"""README.md and docs/ against the code they describe.

- docs/cli.md lists every flag of every verb: under each `<!-- flags: vaecf VERB -->` marker a
  fenced block written from the parser (`python tests/test_docs.py --write` rewrites the
  blocks); the flag names in a block must be exactly the parser's. Help texts and defaults are
  not compared: `vaecf VERB --help` is their reference.
- docs/cli.md names no flag that no verb has.
- Every `vaecf ...` command in README.md's code blocks parses with the real parser; in docs/, the
  verb exists and every flag on the line is one of that verb's.
- Every relative link in README.md and docs/*.md reaches an existing file (and heading, where it
  names one); the files named in prose (`benchmarks/...`, `tests/...`) exist; nothing points
  outside the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from vaecf.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI_MD = DOCS / "cli.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

MARKER = re.compile(r"^<!-- flags: (vaecf(?: [\w.-]+)*) -->$")
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
SHELL_FENCES = {"", "sh", "bash", "shell", "console"}
NAME = "NAME"  # stands for any registry dataset under `vaecf prepare`


# -- the parsers ----------------------------------------------------------------------------------
def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _registry_names() -> list[str]:
    from vaecf.data import datasets

    return list(datasets.names())


def commands() -> dict[str, argparse.ArgumentParser]:
    """'vaecf VERB ...' -> its parser, for the top level and every leaf verb; the registry
    datasets under `prepare` collapse to one 'vaecf prepare NAME' (they take the same flags)."""
    names = set(_registry_names())
    out = {"vaecf": build_parser()}

    def walk(p, path):
        subs = _subparsers(p)
        if not subs:
            out[" ".join(path)] = p
        for name, sp in subs.items():
            if path[1:] == ["prepare"] and name in names:
                if f"vaecf prepare {NAME}" not in out:
                    out[f"vaecf prepare {NAME}"] = sp
                continue
            walk(sp, [*path, name])

    walk(out["vaecf"], ["vaecf"])
    return out


def flags_of(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings if o not in ("-h", "--help")}


def all_flags() -> set[str]:
    every = set()
    for p in _every_parser(build_parser()):
        every |= flags_of(p)
    return every


def _every_parser(p):
    yield p
    for sp in _subparsers(p).values():
        yield from _every_parser(sp)


def synopsis(cmd: str, p: argparse.ArgumentParser, width: int = 96) -> str:
    """The flags block for one command: its usage line, then one usage line per argument group
    (argparse's own rendering of each flag and its value; no help text, no defaults)."""
    plain, titled = [], []
    for group in p._action_groups:
        acts = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if group.title in ("positional arguments", "options", "optional arguments"):
            plain += acts
        elif acts:
            titled.append((group.title, acts))
    f = argparse.HelpFormatter(cmd, width=width)
    f.add_usage(None, plain, [], prefix="")
    lines = [f.format_help().strip("\n")]
    for title, acts in titled:
        f = argparse.HelpFormatter("", width=width - 2)
        f.add_usage(None, acts, [], prefix="")
        lines.append(f"{title}:")
        lines.extend("  " + ln.strip() for ln in f.format_help().strip("\n").splitlines())
    return "\n".join(lines)


# -- the pages ------------------------------------------------------------------------------------
def flag_blocks(text: str) -> dict[str, tuple[int, int, str]]:
    """Marker command -> (start, end) line indexes of its fenced block's body, and the body."""
    lines = text.splitlines()
    out = {}
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        assert lines[i + 1].startswith("```"), f"cli.md line {i + 2}: a fence after the marker"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        assert m.group(1) not in out, f"{m.group(1)} has two flag blocks"
        out[m.group(1)] = (i + 2, end, "\n".join(lines[i + 2 : end]))
    return out


def block_flags(body: str) -> set[str]:
    found = set()
    for line in body.splitlines():
        if line.rstrip().endswith(":"):  # a group title, e.g. "Mult-VAE (--model multvae):"
            continue
        found |= set(FLAG.findall(line))
    return found


def fenced(text: str):
    """(first line number, language, lines) of every fenced code block but the flags blocks."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            if not (i and MARKER.match(lines[i - 1].strip())):
                yield i + 2, m.group(1), lines[i + 1 : end]
            i = end
        i += 1


def shell_commands(text: str):
    """(line number, argv) of every command in the shell code blocks: continuation lines
    joined, `$ ` prompts and comments dropped, `a && b` split."""
    for start, lang, lines in fenced(text):
        if lang not in SHELL_FENCES:
            continue
        buf, first = "", None
        for n, line in enumerate(lines, start):
            if first is None:
                first = n
            if line.endswith("\\"):
                buf += line[:-1] + " "
                continue
            buf += line
            s = buf.strip()
            buf, at, first = "", first, None
            if s.startswith("$ "):
                s = s[2:]
            try:
                words = shlex.split(s, comments=True)
            except ValueError:
                continue  # not a shell line (program output)
            cmd = []
            for w in [*words, "&&"]:
                if w in ("&&", "||", ";", "|"):
                    while cmd and "=" in cmd[0] and not cmd[0].startswith("-"):
                        cmd.pop(0)  # VAR=value before the command
                    if cmd:
                        yield at, cmd
                    cmd = []
                else:
                    cmd.append(w)


def vaecf_commands(text: str):
    for n, argv in shell_commands(text):
        if Path(argv[0]).name == "vaecf":
            yield n, argv[1:]


# -- the CLI reference ----------------------------------------------------------------------------
def test_cli_md_lists_every_flag_of_every_verb():
    blocks = flag_blocks(CLI_MD.read_text())
    cmds = commands()
    assert sorted(set(cmds) - set(blocks)) == [], "verbs without a flags block in docs/cli.md"
    assert sorted(set(blocks) - set(cmds)) == [], "flags blocks for verbs that do not exist"
    problems = []
    for cmd, p in cmds.items():
        have, want = block_flags(blocks[cmd][2]), flags_of(p)
        if have != want:
            problems.append(f"{cmd}: missing {sorted(want - have)}, gone {sorted(have - want)}")
    assert not problems, (
        "docs/cli.md's flags differ from the parsers (`python tests/test_docs.py --write` "
        "rewrites the blocks; then say in the prose what changed):\n" + "\n".join(problems)
    )


def test_every_registry_dataset_takes_the_flags_of_prepare_name():
    prepare = _subparsers(build_parser())["prepare"]
    flags = {name: flags_of(sp) for name, sp in _subparsers(prepare).items() if name != "csv"}
    assert set(flags) == set(_registry_names())
    assert len({frozenset(f) for f in flags.values()}) == 1


def named_flags(text: str):
    """(line number, flag) of the flags a page names: in its prose and inline code (a code
    span that starts with another program, `pip install -e ...`, is that program's), and on the
    `vaecf` command lines of its code blocks."""
    # fenced blocks blanked, line count kept; code spans may run across a line break
    prose = re.sub(
        r"^\s*```.*?^\s*```", lambda m: "\n" * m.group().count("\n"), text, flags=re.S | re.M
    )
    line = lambda pos: prose.count("\n", 0, pos) + 1  # noqa: E731
    for m in re.finditer(r"`([^`]+)`", prose):
        words = m.group(1).split()
        if words and (words[0].startswith("-") or Path(words[0]).name == "vaecf"):
            yield from ((line(m.start()), f) for f in FLAG.findall(m.group(1)))
    for m in FLAG.finditer(re.sub(r"`[^`]+`", lambda m: " " * len(m.group()), prose)):
        yield line(m.start()), m.group(1)
    for n, argv in vaecf_commands(text):
        yield from ((n, f) for w in argv for f in FLAG.findall(w) if w.startswith("-"))


def test_cli_md_names_no_flag_that_does_not_exist():
    every = all_flags() | {"-h", "--help"}
    named = sorted(set(named_flags(CLI_MD.read_text())))
    unknown = [f"line {n}: {f}" for n, f in named if f not in every]
    assert not unknown, "docs/cli.md names flags no verb has:\n" + "\n".join(unknown)


# -- commands in README.md and docs/ --------------------------------------------------------------
def _parse(argv: list[str]) -> str | None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


def test_readme_has_vaecf_commands_and_each_parses():
    found = list(vaecf_commands(README.read_text()))
    verbs = {argv[0] for _, argv in found if argv}
    assert {"demo", "prepare", "train", "recommend", "serve"} <= verbs
    bad = [f"README.md line {n}: vaecf {shlex.join(a)}: {_parse(a)}" for n, a in found if _parse(a)]
    assert not bad, "\n".join(bad)


def _leaf(argv: list[str]) -> tuple[argparse.ArgumentParser | None, str]:
    p, path = build_parser(), "vaecf"
    names = set(_registry_names())
    words = iter(argv)
    while subs := _subparsers(p):
        word = next((w for w in words if not w.startswith(("-", "["))), None)
        if word == NAME and path == "vaecf prepare":
            word = sorted(names)[0]
        if word not in subs:
            return None, f"{path} has no verb {word!r} (it has {', '.join(subs)})"
        p, path = subs[word], f"{path} {word}"
    return p, path


def test_docs_commands_name_real_verbs_and_their_flags():
    problems = []
    for page in PAGES[1:]:
        for n, argv in vaecf_commands(page.read_text()):
            p, path = _leaf(argv)
            if p is None:
                problems.append(f"{page.name} line {n}: {path}")
                continue
            flags = {f for w in argv for f in FLAG.findall(w) if w.lstrip("[").startswith("-")}
            wrong = sorted(flags - flags_of(p) - {"-h", "--help"})
            if wrong:
                problems.append(f"{page.name} line {n}: {path} has no {', '.join(wrong)}")
    assert not problems, "\n".join(problems)


# -- links ----------------------------------------------------------------------------------------
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
NAMED_FILE = re.compile(r"(?<![\w/.-])((?:benchmarks|tests|docs)/[\w./-]*\w\.(?:py|sh|md|png))")


def _slugs(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip()
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_reach_existing_files(page):
    text = page.read_text()
    bad = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z+.-]*:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _slugs(dest.read_text()):
            bad.append(f"{target}: no heading #{anchor} there")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_files_exist_and_nothing_points_outside(page):
    text = page.read_text()
    missing = sorted({f for f in NAMED_FILE.findall(text) if not (ROOT / f).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {missing}"
    assert not re.search(r"\.\./shared|(?<![\w.-])shared/", text), (
        f"{page.relative_to(ROOT)} points outside the repository (shared/)"
    )


# -- rewriting the blocks -------------------------------------------------------------------------
def write_blocks() -> list[str]:
    """Rewrite every flags block of docs/cli.md from the parsers; returns the commands whose
    block changed. A command without a marker is reported, not added (the prose decides where
    it goes)."""
    text = CLI_MD.read_text()
    lines = text.splitlines()
    blocks = flag_blocks(text)
    cmds = commands()
    changed = []
    for cmd, (start, end, body) in sorted(blocks.items(), key=lambda kv: -kv[1][0]):
        if cmd not in cmds:
            continue
        new = synopsis(cmd, cmds[cmd])
        if new != body:
            lines[start:end] = new.splitlines()
            changed.append(cmd)
    CLI_MD.write_text("\n".join(lines) + "\n")
    missing = sorted(set(cmds) - set(blocks))
    if missing:
        print("no marker in docs/cli.md for: " + ", ".join(missing), file=sys.stderr)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print("rewrote: " + (", ".join(write_blocks()) or "nothing"))
    elif sys.argv[1:2] == ["--show"]:
        cmds = commands()
        for cmd in sys.argv[2:] or cmds:
            print(f"<!-- flags: {cmd} -->\n```\n{synopsis(cmd, cmds[cmd])}\n```\n")
    else:
        sys.exit("usage: python tests/test_docs.py --write | --show [COMMAND ...]")


def test_readme_shell_commands_resolve_after_its_set_up():
    """Issue 38: after `make demo`, `vaecf ...` was 'command not found'. The set-up the README
    names puts vaecf on PATH (make demo builds .venv/bin/vaecf, the venv's activate script
    puts that on PATH); every shell block's commands start with a word that set-up provides."""
    text = README.read_text()
    install = text[text.index("## Install") : text.index("## Run the demo")]
    assert "make demo" in install and "source .venv/bin/activate" in install
    assert "$(BIN)/vaecf:" in (ROOT / "Makefile").read_text()  # make demo's target
    assert 'vaecf = "vaecf.cli:command"' in (ROOT / "pyproject.toml").read_text()
    assert "pip install 'vaecf" not in text and 'pip install "vaecf' not in text  # not on PyPI
    provided = {"vaecf", "make", "source", "python3", "pip", "curl", "bash", "cd", "git"}
    for block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        lang, body = block
        if lang not in SHELL_FENCES:  # python, a command's output (text)
            continue
        for ln in [ln for ln in body.splitlines() if ln.strip() and not ln.startswith(" ")]:
            first = ln.split()[0]
            assert first in provided or first.startswith("#"), f"README: {ln!r}"
