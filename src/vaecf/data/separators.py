"""A text file's field separator: the names it is passed by (',', '\\t', '::', 'whitespace',
...), the one a file's first lines show where none is given, and the hint a read that found one
field gives.
"""

from __future__ import annotations

import re
from pathlib import Path

from vaecf.config.settings import spelled
from vaecf.data import files
from vaecf.errors import DataError

WHITESPACE = "whitespace"  # --sep whitespace: fields split on runs of spaces and tabs
DOUBLE_COLON = "::"  # MovieLens 1M/10M's .dat files: UserID::MovieID::Rating::Timestamp
SPLIT_SEPS = (WHITESPACE, DOUBLE_COLON)  # read by splitting lines (no quoting), not as CSV
_SEP_NAMES = {"\\t": "\t", "tab": "\t", "space": " ", "ws": WHITESPACE}
# the separators looked for, in order, where a file's first line has no comma
_OTHER_SEPS = (("\t", "'\\t'"), (";", "';'"), ("|", "'|'"), (DOUBLE_COLON, "'::'"))
_OTHER_SEPS += ((WHITESPACE, "whitespace"),)


def split_fields(line: str, sep: str) -> list[str]:
    return line.split() if sep == WHITESPACE else line.split(sep)


def sep_name(sep: str) -> str:
    """How a separator is passed: 'whitespace', '\\t', ';', ..."""
    return dict(_OTHER_SEPS).get(sep, repr(sep))


def sep_hint(line: str, sep: str | None) -> str:
    """Words for a line that reads as one field with separator `sep`: the separator that would
    split it (tab, ';', '|', '::', then runs of spaces), or a question about the separator."""
    for cand, name in _OTHER_SEPS:
        if cand != sep and len(split_fields(line, cand)) > 1:
            return (
                f"; its fields look separated by {name}: pass --sep {name} "
                f"(sep={name if cand != WHITESPACE else repr(name)})"
            )
    return f"; is {spelled('sep')} right?"


def sep_for(path: Path, sep: str | None) -> str:
    """The separator a text file is read with: `sep` where given (checked), else the one
    `found_sep` finds in the file, else tab for .tsv/.tab and ',' for any other file."""
    if sep is not None:
        sep = _SEP_NAMES.get(sep, sep)
        if sep not in SPLIT_SEPS and (len(sep) != 1 or sep in '\r\n"'):
            raise DataError(
                f"{spelled('sep')} {sep!r} is not a field separator: give one character (',', ';', "
                "'|', '\\t' or tab, space), '::', or 'whitespace' for runs of spaces and tabs"
            )
        return sep
    return found_sep(path) or default_sep(path)


def default_sep(path: Path) -> str:
    """The separator a text file's name implies: tab for .tsv/.tab, else ','."""
    return "\t" if files.suffix(path) in {".tsv", ".tab"} else ","


def found_sep(path: Path) -> str | None:
    """The separator of a text file whose first line holds no comma (nor, for .tsv/.tab, a
    tab): the first of tab, ';', '|', '::' and runs of spaces and tabs that splits each of its
    first lines (up to 20) into one number of fields, two or more. None where the default
    separator stands (or nothing splits them: the read then says what it found)."""
    if files.kind(path) != files.TEXT:
        return None
    default = default_sep(path)
    head = files.head(path)
    lines = [ln for ln in re.split(r"\r\n?|\n", head) if ln.strip()]
    if len(head) == 1 << 16 and len(lines) > 1:
        lines.pop()  # cut short by the read
    lines = lines[:20]
    if not lines or default in lines[0]:
        return None
    for cand, _ in _OTHER_SEPS:
        counts = {len(split_fields(ln, cand)) for ln in lines}
        if len(counts) == 1 and counts.pop() > 1:
            return cand
    return None
