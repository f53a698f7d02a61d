"""What kind of file an interactions path is, and how to open it.

Three kinds: Parquet, JSON (JSON Lines, one record a line, as Amazon's, Yelp's and Goodreads'
reviews ship; or one array of records) and delimited text. Text and JSON may be compressed
with gzip, bzip2 or xz, found by the file's first bytes (not its name); they are decompressed
in memory. The kind comes from the name, a compression suffix skipped (`ratings.jsonl.gz` is
JSON). zstd and zip archives are refused with the command that unpacks them, spreadsheets
with how to export them.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from vaecf.errors import DataError

PARQUET, JSON, TEXT = "parquet", "json", "text"
_KINDS = {".parquet": PARQUET, ".pq": PARQUET, ".json": JSON, ".jsonl": JSON, ".ndjson": JSON}
_TEXTS = {".csv", ".tsv", ".tab", ".txt", ".dat", ".data"}  # named as a directory's data files
_PACKED = {".gz", ".gzip", ".bz2", ".xz", ".zst", ".zstd", ".zip"}
_OPENERS = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
_REFUSED = (
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -d"),
    (b"PK\x03\x04", "a zip archive", "unzip"),
)


def check_file(path: Path, what: str = "interactions") -> None:
    """A DataError unless `path` is a file: it does not exist, or it is a directory (naming
    the data files in it)."""
    if path.is_file():
        return
    if not path.is_dir():
        raise DataError(f"{path} does not exist; pass the path of a file of {what}")
    inside = sorted(
        f.name for f in path.iterdir() if f.is_file() and (kind(f) != TEXT or suffix(f) in _TEXTS)
    )
    held = f" (it holds {', '.join(inside[:8])}{', ...' if len(inside) > 8 else ''})"
    raise DataError(
        f"{path} is a directory{held if inside else ''}: pass the path of a file of {what} in it"
    )


def suffix(path: Path) -> str:
    """The name's suffix in lower case, a compression suffix skipped: '.tsv' for r.tsv.gz."""
    sfx = [s.lower() for s in path.suffixes]
    while len(sfx) > 1 and sfx[-1] in _PACKED:
        sfx.pop()
    return sfx[-1] if sfx else ""


def kind(path: Path) -> str:
    """PARQUET, JSON or TEXT, by the file's name."""
    return _KINDS.get(suffix(path), TEXT)


def _opener(path: Path):
    """gzip.open, bz2.open or lzma.open for a compressed file, None for a plain one."""
    with open(path, "rb") as f:
        head = f.read(8)
    if suffix(path) in {".xlsx", ".xls", ".ods"} or head.startswith(b"\xd0\xcf\x11\xe0"):
        raise DataError(
            f"{path} is a spreadsheet, which vaecf does not read: save it as CSV, or read it "
            "with pandas.read_excel and pass the DataFrame to vaecf.fit"
        )
    for magic, what, unpack in _REFUSED:
        if head.startswith(magic):
            raise DataError(
                f"{path} is {what}, which vaecf does not read: unpack it first "
                f"({unpack} {path}) and pass the file inside, or compress it with gzip"
            )
    return next((op for magic, op in _OPENERS if head.startswith(magic)), None)


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, decompressed where it is compressed."""
    op = _opener(path)
    return op(path, "rb") if op else open(path, "rb")


def open_text(path: Path) -> TextIO:
    """The file as UTF-8 text (undecodable bytes replaced), line endings as they are, without
    a byte-order mark (which spreadsheets write first, and the CSV reader drops)."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors="replace", newline="")


def source(path: Path, text: bool = True, sniff: int = 1 << 20):
    """What the Polars readers take: `path`, or its decompressed bytes in memory; for `text`
    (CSV, JSON) with every line ending made LF where the text ends lines with a bare CR (old
    Mac files, or CR mixed with LF), which CSV readers take for one long line. CRLF and LF are
    read as they are."""
    if _opener(path) is None:
        if not text:
            return path
        with open(path, "rb") as f:
            head = f.read(sniff)
        if not re.search(rb"\r(?!\n)", head[:-1] if len(head) == sniff else head):
            return path
        data = path.read_bytes()
    else:
        with open_binary(path) as f, _unpacking(path):
            data = f.read()
    if text and re.search(rb"\r(?!\n)", data):
        data = re.sub(rb"\r\n?", b"\n", data)
    return io.BytesIO(data)


def head(path: Path, chars: int = 1 << 16) -> str:
    """The first `chars` characters of the file's text (`open_text`)."""
    with open_text(path) as f, _unpacking(path):
        return f.read(chars)


def first_line(path: Path) -> str:
    """A text file's first line, without its ending (any of LF, CRLF, CR) and without a UTF-8
    byte-order mark."""
    with open_text(path) as f, _unpacking(path):
        return re.split(r"\r\n?|\n", f.readline(1 << 16))[0]


def first_non_utf8_line(path: Path) -> int | None:
    """The number of the first line that is not valid UTF-8, or None."""
    with open_binary(path) as f, _unpacking(path):
        for n, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return n
    return None


@contextlib.contextmanager
def _unpacking(path: Path) -> Iterator[None]:
    """A compressed file's broken stream (cut short, not what its first bytes say) as a
    DataError naming the file."""
    try:
        yield
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise DataError(f"cannot decompress {path} ({e}); check the file, or unpack it") from None
