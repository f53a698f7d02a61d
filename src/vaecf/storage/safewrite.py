"""Safe writes: atomic files and directories (a reader sees the old state or the new one, never
half), the permissions an ordinary write would give, and what a full disk says. One writer per
directory at a time is vaecf/writelock.py's.

- `atomic_file`: a temp file beside the target, fsynced, then renamed over it.
- `atomic_dir`: a temp directory beside the target, then swapped in with one atomic exchange
  (Linux `renameat2(RENAME_EXCHANGE)`), so the target path never stops existing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from vaecf.errors import DataError, WriteError


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux /proc)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: the classic read-by-setting (not thread-safe)
    os.umask(mask)
    return mask


def free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def no_space_error(e: BaseException, path: Path, free: int | None) -> WriteError | None:
    """A WriteError naming `path` when `e` means the disk is full (libraries that wrap the OSError
    in their own exception are recognised by the free space left at the time)."""
    full = (
        isinstance(e, OSError)
        and e.errno in (errno.ENOSPC, errno.EDQUOT)
        or "No space left" in str(e)
        or "database or disk is full" in str(e)  # SQLite's (Optuna's study storage)
        or (free is not None and free < 1 << 16 and isinstance(e, (OSError, RuntimeError)))
    )
    if full:
        return WriteError(
            f"no space left on the device holding {path} while writing it; "
            "free some space (or choose another location) and run the command again. "
            "Nothing already there was changed"
        )
    return None


def disk_full_in(e: BaseException, path: Path) -> bool:
    """Whether `e`, or an exception it was raised from (libraries wrap the OSError or SQLite's
    error in their own), means the disk holding `path` is full."""
    free, seen = free_bytes(path), set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if no_space_error(e, path, free) is not None:
            return True
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike,
    mode: str = "wb",
    newline: str | None = None,
    make_parent: bool = True,
) -> Iterator[Any]:
    """Open a temp file beside `path`; on clean exit fsync and rename it over `path`.

    The file gets the mode an ordinary `open(path, "w")` would (0666 minus the umask). A full
    disk raises a WriteError naming `path`; the temp file is removed and `path` is untouched.
    Its directory is created where missing, unless `make_parent` is False: then a missing
    directory raises FileNotFoundError.
    """
    path = Path(path)
    if make_parent:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode, newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as e:
        free = free_bytes(path.parent)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if (err := no_space_error(e, path, free)) is not None:
            raise err from None
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_file(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _old_siblings(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)


def recover_dir(path: str | os.PathLike) -> None:
    """Undo a swap cut short (systems without an atomic exchange): if `path` is missing but the
    previous version was set aside as `.NAME.old-PID`, put it back."""
    path = Path(path)
    if path.exists():
        return
    olds = _old_siblings(path)
    if olds:
        with contextlib.suppress(OSError):
            os.replace(olds[-1], path)


def sweep_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temp files/dirs that killed writes of `path` left beside it. Call it only while
    holding `writer_lock` on `path`, so that no live write is removed."""
    path = Path(path)
    removed: list[Path] = []
    if not path.parent.is_dir():
        return removed
    recover_dir(path)  # a set-aside previous version is data, not a remain
    for p in [*path.parent.glob(f".{path.name}.*.tmp"), *path.parent.glob(f".{path.name}.old-*")]:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temp directory beside `path`; on clean exit it replaces `path`.

    The replacement is one atomic exchange where the OS has one (Linux), so `path` is at every
    instant the complete old directory or the complete new one. The directory gets the mode an
    ordinary `mkdir` would (0777 minus the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(path)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        os.chmod(tmp, 0o777 & ~current_umask())
        yield tmp
        for child in tmp.iterdir():  # the files' data is durable before the swap
            if child.is_file():
                with open(child, "rb") as f:
                    os.fsync(f.fileno())
        fsync_dir(tmp)
        if path.exists() and exchange(tmp, path):
            fsync_dir(path.parent)
            shutil.rmtree(tmp, ignore_errors=True)  # now the old version
            return
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        free = free_bytes(path.parent)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if (err := no_space_error(e, path, free)) is not None:
            raise err from None
        raise


# -- sparse matrices ------------------------------------------------------------------------------
def save_csr(path: str | os.PathLike, m: sp.csr_matrix) -> None:
    """Write `m` as a scipy .npz, atomically."""
    with atomic_file(path) as f:
        sp.save_npz(f, m.tocsr(), compressed=False)


def load_csr(path: str | os.PathLike) -> sp.csr_matrix:
    """Read a CSR .npz written by `save_csr`; a missing, corrupted or malformed file is a
    DataError that names it."""
    try:
        m = sp.load_npz(path)
        m = m.tocsr()
        if m.nnz and (m.indices.min() < 0 or m.indices.max() >= m.shape[1]):
            raise ValueError("column index out of range")
    except FileNotFoundError:
        raise DataError(
            f"{path} is missing; prepare the dataset again (vaecf prepare ... --overwrite)"
        ) from None
    except Exception as e:  # zip/npz corruption, malformed arrays
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise DataError(
            f"{path} is corrupted or not a vaecf matrix ({msg}); "
            "prepare the dataset again (vaecf prepare ... --overwrite)"
        ) from None
    return m.astype(np.float32)
