"""One writer per directory: `writer_lock` holds `.NAME.lock` beside the directory, created with
O_EXCL and holding the writer's pid, host and process start time; a lock left by a dead process
(or a reused pid) is taken over, a live holder's named in a BusyError.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from vaecf.errors import BusyError
from vaecf.storage.safewrite import free_bytes, no_space_error


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (Linux), to tell a live holder from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def lock_path(directory: str | os.PathLike) -> Path:
    """Where `writer_lock(directory)` keeps its lock: `.NAME.lock` beside the directory."""
    directory = Path(directory)
    return directory.parent / f".{directory.name}.lock"


def _read_lock(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: written by a process killed mid-write, or foreign


def _holder_is_live(info: dict, path: Path, guarded: bool) -> bool:
    pid = info.get("pid")
    if not isinstance(pid, int):
        # empty or torn. Holders write it while holding the directory guard, so under the guard
        # it can only be the remains of a process killed mid-write; without one, trust it a while
        if guarded:
            return False
        with contextlib.suppress(OSError):
            return time.time() - path.stat().st_mtime < 5.0
        return False
    if info.get("host") not in (None, socket.gethostname()):
        return True  # cannot tell for a process on another machine: assume it runs
    if not _alive(pid):
        return False
    started = info.get("started")
    return started is None or process_start_time(pid) in (None, started)


@contextlib.contextmanager
def _dir_guard(directory: Path) -> Iterator[bool]:
    """Serialise lock acquisition in `directory` (flock, released by the kernel on death)."""
    try:
        import fcntl

        fd = os.open(directory, os.O_RDONLY)
    except (ImportError, OSError):  # not POSIX: O_EXCL alone
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # releases the flock


_HELD: set[str] = set()  # locks this process holds (writer_lock is re-entrant)


@contextlib.contextmanager
def writer_lock(directory: str | os.PathLike, what: str = "writing") -> Iterator[Path]:
    """Hold the one-writer lock of `directory` for the duration of the block.

    The lock is `.NAME.lock` beside the directory (it survives the directory being swapped
    whole), created with O_EXCL and holding {pid, host, started}. If another live process
    holds it, a BusyError names that pid; a lock whose process is dead is taken over.
    Re-entrant within one process.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_path(directory)
    key = str(lock.resolve())
    if key in _HELD:  # re-entered by the same process: already ours
        yield lock
        return
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": process_start_time(os.getpid()),
        "what": what,
    }
    _take_lock(lock, directory, me)
    _HELD.add(key)
    try:
        yield lock
    finally:
        _HELD.discard(key)
        if (_read_lock(lock) or {}).get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                lock.unlink()


def _take_lock(lock: Path, directory: Path, me: dict) -> None:
    """Create `lock` holding `me`, taking over a lock whose process is dead; BusyError where a
    live process holds it."""
    with _dir_guard(directory.parent) as guarded:
        for _ in range(3):
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                info = _read_lock(lock)
                if info is None:
                    continue  # released meanwhile
                if _holder_is_live(info, lock, guarded):
                    pid = info.get("pid", "?")
                    host = info.get("host")
                    where = f" on {host}" if host and host != me["host"] else ""
                    raise BusyError(
                        f"{directory} is being written by another vaecf process (pid {pid}"
                        f"{where}, {info.get('what', 'writing')}); wait for it to finish or stop "
                        f"it (the lock {lock} of a process that died is taken over by itself)"
                    ) from None
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()  # stale: its process is dead
                continue
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(me, f)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                free = free_bytes(lock.parent)
                with contextlib.suppress(OSError):
                    lock.unlink()
                if (err := no_space_error(e, lock, free)) is not None:
                    raise err from None
                raise
            break
        else:
            raise BusyError(f"could not take the lock {lock}; run the command again")
