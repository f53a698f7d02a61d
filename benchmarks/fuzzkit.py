"""Fuzz kit: Hypothesis strategies of malformed interaction files for every parser, and the one
property they must all keep: a file either parses as its format says, or raises a DataError that
names the file (and the line or row, when one line is to blame). Nothing else may escape.

Imported by tests/data/test_fuzz_parsers.py (a few hundred inputs) and benchmarks/drills.py
(>= 10,000 per parser). Inputs are built from rows of fields, each field valid or drawn from a
list of known-bad tokens, then mangled at the byte level: CRLF, a UTF-8 BOM, latin-1 text,
truncation at any byte, random bytes spliced in, or an empty or header-only file.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from vaecf.data import parsers, sources
from vaecf.errors import DataError

BAD_TOKENS = [
    "", " ", "nan", "NaN", "inf", "-inf", "-1", "-0.5", "1e400", "1.5", "abc", "é", "9" * 25,
    "0x1F", "1,2", "\t", "::", '"', "'", "\x00", "１２", "-9223372036854775809", "None", "null",
]  # fmt: skip

# a message names a line or data row, or the failure concerns the whole file
_WHERE = re.compile(r"\b(line|row) \d+")
_FILE_LEVEL = (
    "is empty",
    "no rows",
    "has a header but no rows",
    "none of its",
    "more than 1%",
    "no column(s)",
    "values",
    "cannot read",
    "not valid UTF-8",
    "expected one",
    "cannot decompress",
    "does not read",  # a spreadsheet, a zstd or zip archive, by its first bytes
)


@dataclass
class Case:
    """One parser and how to make files for it."""

    name: str
    filename: str
    parse: Callable[[Path], pl.DataFrame]
    fields: tuple[str, ...]  # kind of each field: int, num, str, date, head (netflix)
    sep: str
    header: str | None = None
    pack: str | None = None  # "gzip" or "zip": the file's bytes packed (then, at times, cut)
    json: bool = False  # each row a JSON record of the fields (JSON Lines)


def _read_table(sep):
    return lambda p: sources.read_table(p, "u", "i", "r", sep)


CASES = {
    "csv": Case("csv", "x.csv", _read_table(None), ("int", "str", "num"), ",", "u,i,r"),
    "tsv": Case("tsv", "x.tsv", _read_table(None), ("str", "int", "num"), "\t", "u\ti\tr"),
    "movielens-csv": Case(
        "movielens-csv",
        "ratings.csv",
        lambda p: parsers.read_movielens_csv([p])[0],
        ("int", "int", "num", "int"),
        ",",
        "userId,movieId,rating,timestamp",
    ),
    "movielens-dat": Case(
        "movielens-dat",
        "ratings.dat",
        lambda p: parsers.read_movielens_dat([p])[0],
        ("int", "int", "int", "int"),
        "::",
    ),
    "netflix": Case(
        "netflix",
        "mv_0000001.txt",
        lambda p: parsers.read_netflix([p])[0],
        ("int", "int", "date"),
        ",",
    ),
    "lastfm": Case(
        "lastfm",
        "usersha1-artmbid-artname-plays.tsv",
        lambda p: parsers.read_lastfm([p])[0],
        ("str", "str", "str", "int"),
        "\t",
    ),
    "pinterest": Case(
        "pinterest",
        "pinterest-20.train.rating",
        lambda p: parsers.read_pinterest([p])[0],
        ("int", "int", "num", "int"),
        "\t",
    ),
    "msd": Case(
        "msd", "train_triplets.txt", lambda p: parsers.read_msd([p])[0], ("str", "str", "int"), "\t"
    ),
    # read_table with the separator left to it (separators.found_sep) and the files it unpacks
    "semicolons": Case("semicolons", "x.txt", _read_table(None), ("int", "str", "num"), ";",
                       "u;i;r"),
    "colons": Case("colons", "x.dat", _read_table(None), ("int", "int", "num"), "::", "u::i::r"),
    "csv-gz": Case("csv-gz", "x.csv.gz", _read_table(None), ("int", "str", "num"), ",", "u,i,r",
                   pack="gzip"),
    "csv-zip": Case("csv-zip", "x.zip", _read_table(None), ("int", "str", "num"), ",", "u,i,r",
                    pack="zip"),
    "jsonl": Case("jsonl", "x.jsonl", _read_table(None), ("int", "str", "num"), "", json=True),
    "jsonl-gz": Case("jsonl-gz", "x.jsonl.gz", _read_table(None), ("int", "str", "num"), "",
                     pack="gzip", json=True),
}  # fmt: skip


def _valid(kind: str) -> st.SearchStrategy[str]:
    if kind == "int":
        return st.integers(0, 10**6).map(str)
    if kind == "num":
        return st.sampled_from(["0.5", "1", "2.5", "3", "4.0", "5"])
    if kind == "date":
        return st.just("2005-09-06")
    return st.text("abcdef0123456789", min_size=1, max_size=12)


def _field(kind: str) -> st.SearchStrategy[str]:
    return st.one_of(_valid(kind), _valid(kind), _valid(kind), st.sampled_from(BAD_TOKENS))


@st.composite
def file_bytes(draw, case: Case) -> bytes:
    """A file for `case`: rows of (mostly) valid fields, then byte-level damage."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.binary(max_size=300))  # pure noise
    n = draw(st.integers(0, 12))
    clean = draw(st.integers(0, 3)) == 0  # a quarter of the files: every field valid
    field_of = _valid if clean else _field
    lines = []
    if case.header is not None and draw(st.integers(0, 9)):
        lines.append(case.header)
    for _ in range(n):
        if case.name == "netflix" and (not lines or draw(st.integers(0, 4)) == 0):
            head = _valid("int") if clean else st.one_of(_valid("int"), st.sampled_from(BAD_TOKENS))
            lines.append(draw(head) + ":")
            continue
        kinds = list(case.fields)
        k = draw(st.integers(0, 9)) if not clean else 9
        if k == 0 and kinds:  # too short
            kinds = kinds[: draw(st.integers(0, len(kinds) - 1))]
        elif k == 1:  # too long
            kinds += ["str"] * draw(st.integers(1, 3))
        values = [draw(field_of(kind)) for kind in kinds]
        lines.append(_record(draw, values, clean) if case.json else case.sep.join(values))
    eol = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    text = eol.join(lines) + (eol if lines and draw(st.booleans()) else "")
    data = text.encode("latin-1" if draw(st.integers(0, 5)) == 0 else "utf-8", errors="replace")
    if draw(st.integers(0, 5)) == 0:
        data = b"\xef\xbb\xbf" + data
    if data and draw(st.integers(0, 5)) == 0:  # truncated anywhere
        data = data[: draw(st.integers(0, len(data)))]
    if draw(st.integers(0, 7)) == 0:  # random bytes spliced in
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    if case.pack is not None:
        data = gzip.compress(data) if case.pack == "gzip" else _zipped(data)
        if draw(st.integers(0, 5)) == 0:  # a download cut short
            data = data[: draw(st.integers(0, len(data)))]
    return data


def _zipped(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ratings.csv", data)
    return buf.getvalue()


def _record(draw, values: list[str], clean: bool) -> str:
    """A JSON record of fields u, i, r (as many as `values`): each value as text, or as the
    number it spells; unless `clean`, at times a field missing, a list, or a line that is not
    JSON."""
    rec = {}
    for name, v in zip("uir", values):
        how = draw(st.integers(1, 8) if clean else st.integers(0, 9))
        if how == 0:
            continue  # a record without the field
        try:
            number = json.loads(v) if how < 5 else None
        except ValueError:
            number = None
        rec[name] = [v] if how == 9 else (number if isinstance(number, (int, float)) else v)
    text = json.dumps(rec)
    return text[:-1] if not clean and draw(st.integers(0, 19)) == 0 else text  # not JSON


@st.composite
def parquet_frames(draw) -> pl.DataFrame:
    """Frames with columns u, i, r of assorted types, nulls, NaN and odd values."""
    n = draw(st.integers(0, 8))
    col = st.one_of(
        st.lists(st.integers(0, 50), min_size=n, max_size=n),
        st.lists(st.sampled_from(["a", "b", "7", " c "]), min_size=n, max_size=n),
        st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=n, max_size=n),
        st.lists(st.one_of(st.none(), st.sampled_from(BAD_TOKENS), st.text(max_size=5)),
                 min_size=n, max_size=n),
        st.lists(st.one_of(st.none(), st.floats(allow_nan=True)), min_size=n, max_size=n),
        st.lists(st.booleans(), min_size=n, max_size=n),
    )  # fmt: skip
    names = draw(st.sampled_from([("u", "i", "r"), ("u", "i"), ("u", "x", "r")]))
    return pl.DataFrame({name: draw(col) for name in names}, strict=False)


def check(case_name: str, path: Path) -> str:
    """Parse `path` with the case's parser: 'parsed' or 'rejected'; AssertionError when the
    outcome breaks the property (a non-DataError escapes, or a message names no file/line, or a
    parsed frame holds nulls or non-finite ratings)."""
    parse = PARQUET.parse if case_name == "parquet" else CASES[case_name].parse
    try:
        df = parse(path)
    except DataError as e:
        msg = str(e)
        assert str(path) in msg, f"message does not name the file: {msg!r}"
        assert _WHERE.search(msg) or any(k in msg for k in _FILE_LEVEL), (
            f"message names no line or row: {msg!r}"
        )
        assert "\n" not in msg.strip(), f"message is not one line: {msg!r}"
        return "rejected"
    assert (
        {sources.USER, sources.ITEM}
        <= set(df.columns)
        <= {sources.USER, sources.ITEM, sources.RATING, sources.TIME}
    ), df.columns
    assert df.height > 0
    for c in (sources.USER, sources.ITEM):
        s = df.get_column(c)
        assert s.null_count() == 0, f"null {c}"
        assert s.dtype == pl.String or s.dtype.is_integer(), s.dtype
        if s.dtype == pl.String:
            assert not (s.str.strip_chars() == "").any(), f"blank {c}"
    if sources.RATING in df.columns:
        r = df.get_column(sources.RATING)
        assert r.null_count() == 0 and all(math.isfinite(v) for v in r.to_list()), "bad rating"
    if sources.TIME in df.columns:
        t = df.get_column(sources.TIME)
        assert t.null_count() == 0 and all(math.isfinite(v) for v in t.to_list()), "bad time"
    return "parsed"


PARQUET = Case("parquet", "x.parquet", _read_table(None), (), "")


@dataclass
class FuzzTally:
    parser: str
    inputs: int = 0
    parsed: int = 0
    rejected: int = 0
    failures: int = 0
    examples: list[str] = field(default_factory=list)


def fuzz(case_name: str, n: int, seed: int = 0) -> FuzzTally:
    """Run `n` generated inputs through one parser and count outcomes (no shrinking; failures
    are recorded, not raised, so every input runs)."""
    t = FuzzTally(case_name)
    tmp = Path(tempfile.mkdtemp(prefix="vaecf-fuzz-"))
    case = PARQUET if case_name == "parquet" else CASES[case_name]
    path = tmp / case.filename
    strategy = parquet_frames() if case_name == "parquet" else file_bytes(case)

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(strategy)
    def one(x):
        t.inputs += 1
        if isinstance(x, pl.DataFrame):
            x.write_parquet(path)
        else:
            path.write_bytes(x)
        try:
            outcome = check(case_name, path)
        except AssertionError as e:
            t.failures += 1
            if len(t.examples) < 5:
                t.examples.append(f"{e}\ninput: {x!r}"[:600])
            return
        except Exception as e:  # noqa: BLE001 - a traceback the CLI would show
            t.failures += 1
            if len(t.examples) < 5:
                t.examples.append(f"{type(e).__name__}: {e}\ninput: {x!r}"[:600])
            return
        setattr(t, outcome, getattr(t, outcome) + 1)

    import random

    from hypothesis import seed as hseed

    hseed(seed)(one)() if seed is not None else one()
    random.seed()
    return t
