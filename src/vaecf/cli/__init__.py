"""Command line: one verb per user task, one module per family of verbs. Thin: parse, call the
library, print.

Exit codes: 0 ok, 2 bad input (vaecf's own input errors: a message says what to do), 1 failure.
"""

from __future__ import annotations

import argparse
import errno
import faulthandler
import gc
import os
import sys

from vaecf.cli import bench, data, experiments, recommend, serve, train

# Operating-system errors the user fixes (space, quota, permissions, a read-only filesystem):
# exit 2 with the path, never a traceback.
_USER_FIXABLE = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)

VERB_MODULES = (data, train, recommend, bench, serve, experiments)


class Parser(argparse.ArgumentParser):
    """A bad command line gets one line on what is wrong (the nearest choice where one was
    mistyped) and where to read more, not the verb's whole usage."""

    verbs = None  # this parser's sub-commands (`add_subparsers`), if any
    deepest = None  # the innermost parser of the command line being parsed: the verb's

    def add_subparsers(self, **kwargs):
        self.verbs = super().add_subparsers(**kwargs)
        return self.verbs

    def parse_known_args(self, args=None, namespace=None):
        Parser.deepest = self  # a verb's parser is called after the one above it
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        import difflib
        import re

        wrong = re.search(r"invalid choice: '?([^' ]*)'? \(choose from (.*)\)", message)
        unknown = re.fullmatch(r"unrecognized arguments: (.*)", message)
        if wrong:
            choices = [c.strip(" '") for c in wrong.group(2).split(",")]
            near = difflib.get_close_matches(wrong.group(1), choices, 1)
            message += f"; did you mean {near[0]!r}?" if near else ""
        elif unknown and Parser.deepest not in (None, self):
            Parser.deepest.unknown(unknown.group(1).split())  # the verb's flags, the verb's help
        elif self.verbs is not None and message.endswith(f"required: {self.verbs.metavar}"):
            message += f" (one of: {', '.join(self.verbs.choices)})"  # `vaecf prepare` alone
        self.exit(2, f"{self.prog}: error: {message}\nsee `{self.prog} --help`\n")

    def unknown(self, words: list[str]):
        """Refuse the words this (verb's) parser does not know, with its nearest flag."""
        import difflib
        import re

        flags = sorted(set(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", self.format_help())))
        parts = []
        for word in words:
            near = difflib.get_close_matches(word.split("=")[0], flags, 1, 0.7)
            hint = f" (did you mean {near[0]}?)" if word.startswith("-") and near else ""
            parts.append(f"{word}{hint}")
        what = "argument" if len(words) == 1 else "arguments"
        self.exit(
            2,
            f"{self.prog}: error: unrecognized {what}: {', '.join(parts)}\n"
            f"see `{self.prog} --help`\n",
        )


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="vaecf",
        description=(
            "Recommendations from implicit feedback with Mult-VAE, Mult-DAE, RecVAE, EASE, "
            "EDLAE, inf-AE or auto (the best of several): prepare interaction data, train, "
            "evaluate, recommend, serve."
        ),
    )
    from vaecf.version import __version__

    p.add_argument("--version", action="version", version=f"vaecf {__version__}")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    for module in VERB_MODULES:
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # `vaecf` alone: what it can do
        parser.print_help(sys.stderr)
        print("\nstart with `vaecf demo`; `vaecf VERB --help` for a verb's flags", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    from vaecf.config.settings import READER
    from vaecf.errors import VaecfError

    reader = READER.set("cli")  # messages name flags, not keyword arguments
    try:
        return args.fn(args)
    except VaecfError as e:
        print(f"vaecf {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in _USER_FIXABLE:
            raise
        where = f" ({e.filename})" if e.filename else ""
        print(f"vaecf {args.verb}: error: {e.strerror}{where}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        if type(e).__name__ != "TrainingDiverged":
            raise
        print(f"vaecf {args.verb}: failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"vaecf {args.verb}: interrupted{f'; {e}' if str(e) else ''}", file=sys.stderr)
        return 130
    finally:
        READER.reset(reader)


def command() -> int:
    """The `vaecf` command (and `python -m vaecf`): `main`, in a process about to exit. Its
    objects are frozen out of the collector first: the interpreter's last collection would
    otherwise walk every object PyTorch made. On a 2-core Zen 3, `python -c "import torch"`
    took 3.3 s, 2.6 s with gc.freeze() last (5 runs each); `vaecf bench infer 100 --seconds
    0.1` 3.83 s, 3.47 s with it (farm-bench, medians of 8 pairs). A native crash (a fatal
    signal in a compiled library) prints the Python stack that reached it (faulthandler)
    instead of dying without a word; a reader that closes the output early (`vaecf models |
    head`) ends it quietly, as other commands do."""
    faulthandler.enable()
    try:
        rc = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # 128 + SIGPIPE, as a shell reports it
    gc.freeze()
    return rc


if __name__ == "__main__":
    raise SystemExit(command())
