"""Safe extraction of dataset archives (zip and tar, plain or compressed).

Only regular files are written, and only under the target directory: an entry with an absolute
path, a `..` part or a drive letter, and a link or device entry the caller wants, make the whole
archive refused. Files appear all at once: they are extracted into a temporary directory beside
the target, then moved into place.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from vaecf.errors import DataError

CHUNK = 1 << 20
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")

Wanted = Callable[[str], bool] | None


def is_archive(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and name.endswith(ARCHIVE_SUFFIXES)


def _safe_name(name: str, archive: Path) -> PurePosixPath:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or re.match(r"^[A-Za-z]:", name):
        raise DataError(
            f"{archive.name} holds an entry {name!r} that would land outside the "
            "target directory; refusing to extract it (the archive is not trustworthy)"
        )
    return p


def _zip_members(archive: Path, wanted: Wanted) -> Iterator[tuple[PurePosixPath, IO[bytes]]]:
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            rel = _safe_name(info.filename, archive)
            if info.is_dir() or (wanted and not wanted(rel.name)):
                continue
            with z.open(info) as src:
                yield rel, src


def _tar_members(archive: Path, wanted: Wanted) -> Iterator[tuple[PurePosixPath, IO[bytes]]]:
    with tarfile.open(archive, "r:*") as t:
        for m in t:
            rel = _safe_name(m.name, archive)
            if m.issym() or m.islnk() or m.isdev():
                if wanted is None or wanted(rel.name):
                    raise DataError(
                        f"{archive.name} holds a link or device entry {m.name!r}; "
                        "refusing to extract it"
                    )
                continue
            if not m.isfile() or (wanted and not wanted(rel.name)):
                continue
            src = t.extractfile(m)
            if src is not None:
                with src:
                    yield rel, src


def extract(archive: Path, target: Path, wanted: Wanted = None) -> list[Path]:
    """Extract regular files of `archive` (those whose base name `wanted(name)` accepts) into
    `target`, atomically per file set: all of them appear, or none. Returns the paths written."""
    target.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{archive.name}.", suffix=".extract", dir=target))
    members = _zip_members if archive.name.lower().endswith(".zip") else _tar_members
    try:
        written: list[PurePosixPath] = []
        for rel, src in members(archive, wanted):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            with open(tmp / rel, "wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
            written.append(rel)
        out = []
        for rel in written:
            dst = target / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, dst)
            out.append(dst)
        return out
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise  # a real I/O problem (disk full, permissions), not a damaged archive
        raise DataError(
            f"{archive} is truncated or corrupt ({e}); delete it and download it "
            "again (nothing was extracted)"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
