"""What kind of file an interactions path is, and how to open it.

Three kinds: Parquet (a file, or a directory of Parquet parts as Spark, Dask and pandas write a
table: `parts`), JSON (JSON Lines, one record a line, as Amazon's, Yelp's and Goodreads'
reviews ship; or one array of records) and delimited text. Text and JSON may be compressed
with gzip, bzip2 or xz, found by the file's first bytes (not its name); they are decompressed
in memory, or, above `IN_MEMORY` compressed bytes, into a temp file (TMPDIR) read from disk.
The kind comes from the name, a compression suffix skipped (`ratings.jsonl.gz` is JSON); a zip
archive holding one data file (as Kaggle's downloads come) is read as that file. zstd archives
are refused with the command that unpacks them, spreadsheets with how to export them.
"""

from __future__ import annotations

import atexit
import bz2
import contextlib
import gzip
import io
import lzma
import os
import re
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from vaecf.errors import DataError

PARQUET, JSON, TEXT = "parquet", "json", "text"
_KINDS = {".parquet": PARQUET, ".pq": PARQUET, ".json": JSON, ".jsonl": JSON, ".ndjson": JSON}
_TEXTS = {".csv", ".tsv", ".tab", ".txt", ".dat", ".data"}  # named as a directory's data files
_DATA = _TEXTS | set(_KINDS) | {".zip"}  # suffixes of data files, by their names
_SHEETS = {".xlsx", ".xls", ".ods"}
_PACKED = {".gz", ".gzip", ".bz2", ".xz", ".zst", ".zstd", ".zip"}
_OPENERS = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
_REFUSED = ((b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -d"),)
_ZIP = b"PK\x03\x04"
IN_MEMORY = 32 << 20  # compressed bytes unpacked in memory; a larger file into a temp file
BLOCK = 1 << 22  # bytes unpacked at a time into that temp file
_BARE_CR = re.compile(rb"\r(?!\n)")  # a line ending of old Mac files, which CSV readers miss
_UNPACKED: dict[tuple, Path] = {}  # (path, size, mtime, text) -> its unpacked temp file


def check_file(path: Path, what: str = "interactions") -> None:
    """A DataError unless `path` is a file or a directory of Parquet parts: it does not exist,
    or it is another directory (naming the data files in it)."""
    if path.is_file():
        return
    if (path / "manifest.json").is_file():
        raise DataError(
            f"{path} is a prepared dataset (vaecf prepare's output): train on it with "
            f"vaecf train --data {path}, or pass the file it was prepared from"
        )
    if path.is_dir() and (found := parts(path)):
        return _one_table(path, found)
    if not path.is_dir():
        raise DataError(f"{path} does not exist; pass the path of a file of {what}")
    inside = sorted(f.name for f in path.iterdir() if f.is_file() and suffix(f) in _DATA)
    held = f" (it holds {', '.join(inside[:8])}{', ...' if len(inside) > 8 else ''})"
    raise DataError(
        f"{path} is a directory{held if inside else ''}: pass the path of a file of {what} in it"
    )


def _one_table(path: Path, found: list[Path]) -> None:
    """A DataError unless the Parquet parts all have the same columns (one table's parts)."""
    import polars as pl

    first = None
    for f in found:
        try:
            cols = list(pl.read_parquet_schema(f))
        except (pl.exceptions.PolarsError, OSError) as e:
            raise DataError(f"cannot read {f} as Parquet: {e}") from None
        if first is None:
            first = (f, cols)
        elif cols != first[1]:
            raise DataError(
                f"{path} holds Parquet files of different columns ({first[0].relative_to(path)}: "
                f"{first[1]}; {f.relative_to(path)}: {cols}), not one table's parts: pass one file"
            )


def suffix(path: Path) -> str:
    """The name's suffix in lower case, a compression suffix skipped: '.tsv' for r.tsv.gz."""
    sfx = [s.lower() for s in path.suffixes]
    while len(sfx) > 1 and sfx[-1] in _PACKED:
        sfx.pop()
    return sfx[-1] if sfx else ""


def kind(path: Path) -> str:
    """PARQUET, JSON or TEXT, by the file's name (a zip archive: its data file's; a directory
    of Parquet parts: PARQUET)."""
    if path.is_dir():
        return PARQUET if parts(path) else TEXT
    if path.is_file() and _head(path).startswith(_ZIP) and suffix(path) not in _SHEETS:
        return _KINDS.get(suffix(Path(_zip_member(path))), TEXT)
    return _KINDS.get(suffix(path), TEXT)


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(8)


def _zip_member(path: Path) -> str:
    """The one data file in a zip archive (as Kaggle's downloads come): its name in the
    archive. An archive of several is refused naming them, as is a broken one."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [i.filename for i in z.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"cannot read {path} as a zip archive ({e}); check the file") from None
    names = [n for n in names if not any(p.startswith((".", "_")) for p in n.split("/"))]
    data = [n for n in names if suffix(Path(n)) in _DATA] or names
    if len(data) != 1:
        held = f"{len(data)} files ({', '.join(data[:8])}{', ...' if len(data) > 8 else ''})"
        raise DataError(
            f"{path} is a zip archive of {held if data else 'no files'}: unzip it "
            f"(unzip {path}) and pass the file of interactions"
        )
    return data[0]


def _zip_open(path: Path, mode: str = "rb") -> BinaryIO:
    return zipfile.ZipFile(path).open(_zip_member(path))


def parts(path: Path) -> list[Path]:
    """A directory's Parquet parts, in its subdirectories too (Hive's key=value layout), in
    name order; not the writers' hidden and marker files (.crc, _SUCCESS). [path] for a file."""
    if not path.is_dir():
        return [path]
    return sorted(
        f
        for f in path.rglob("*")
        if f.suffix.lower() in {".parquet", ".pq"}
        and not any(p.startswith((".", "_")) for p in f.relative_to(path).parts)
        and f.is_file()
    )


def _opener(path: Path):
    """gzip.open, bz2.open, lzma.open or the zip member's opener for a compressed file, None
    for a plain one."""
    head = _head(path)
    if suffix(path) in _SHEETS or head.startswith(b"\xd0\xcf\x11\xe0"):
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
    if head.startswith(_ZIP):
        return _zip_open
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
    """What the Polars readers take: `path`, its Parquet parts (a directory), or its
    decompressed bytes in memory; for `text`
    (CSV, JSON) with every line ending made LF where the text ends lines with a bare CR (old
    Mac files, or CR mixed with LF), which CSV readers take for one long line. CRLF and LF are
    read as they are."""
    if path.is_dir():
        return [str(f) for f in parts(path)]  # Parquet parts, read as one table
    if _opener(path) is None:
        if not text:
            return path
        with open(path, "rb") as f:
            head = f.read(sniff)
        if not _BARE_CR.search(head[:-1] if len(head) == sniff else head):
            return path
        data = path.read_bytes()
    elif path.stat().st_size > IN_MEMORY:
        return _unpacked(path, text)
    else:
        with _unpacking(path), open_binary(path) as f:
            data = f.read()
    return io.BytesIO(_BARE_CR.sub(b"\n", data) if text else data)


def _unpacked(path: Path, text: bool) -> Path:
    """A large compressed file unpacked into a temp file (TMPDIR), once per process while it is
    unchanged, removed at exit: the readers then scan it from disk, not from memory."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, text)
    if key in _UNPACKED and _UNPACKED[key].is_file():
        return _UNPACKED[key]
    if not _UNPACKED:
        atexit.register(lambda: [f.unlink(missing_ok=True) for f in _UNPACKED.values()])
    fd, name = tempfile.mkstemp(prefix="vaecf-unpacked-", suffix=suffix(path))
    out = _UNPACKED[key] = Path(name)
    try:
        with os.fdopen(fd, "wb") as dst:
            for block in _blocks(path, text):
                dst.write(block)
    except OSError as e:  # the temp file's disk: the reads' errors are DataErrors already
        out.unlink(missing_ok=True)
        raise DataError(
            f"cannot unpack {path} into {out.parent} ({e.strerror or e}): free space there, set "
            "TMPDIR to a larger disk, or unpack the file yourself and pass it"
        ) from None
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out


def _blocks(path: Path, text: bool) -> Iterator[bytes]:
    """The file's decompressed bytes in blocks of `BLOCK`; for `text`, a bare CR made LF (a CR
    that ends a block waits for the next block's first byte)."""
    carry = b""
    with _unpacking(path), open_binary(path) as f:
        while block := f.read(BLOCK):
            block, carry = carry + block, b""
            if text and block.endswith(b"\r"):
                block, carry = block[:-1], b"\r"
            yield _BARE_CR.sub(b"\n", block) if text else block
    yield carry.replace(b"\r", b"\n")


def head(path: Path, chars: int = 1 << 16) -> str:
    """The first `chars` characters of the file's text (`open_text`)."""
    with _unpacking(path), open_text(path) as f:
        return f.read(chars)


def first_line(path: Path) -> str:
    """A text file's first line, without its ending (any of LF, CRLF, CR) and without a UTF-8
    byte-order mark."""
    with _unpacking(path), open_text(path) as f:
        return re.split(r"\r\n?|\n", f.readline(1 << 16))[0]


def first_non_utf8_line(path: Path) -> int | None:
    """The number of the first line that is not valid UTF-8, or None."""
    with _unpacking(path), open_binary(path) as f:
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
    except (OSError, EOFError, lzma.LZMAError, zipfile.BadZipFile, NotImplementedError) as e:
        raise DataError(f"cannot decompress {path} ({e}); check the file, or unpack it") from None
    except RuntimeError as e:  # zipfile's word for an encrypted member
        raise DataError(f"cannot read {path} ({e}); unpack it and pass the file") from None
