"""Checkpoints: atomic writes, a SHA-256 footer verified on load, `weights_only=True` loads, and a
clear error (naming the file and what to do) for missing, truncated or bit-flipped files.

File layout: a `torch.save` zip, then a 40-byte footer `VAECFSUM` + SHA-256 of everything before
it. torch.load ignores the footer; files written before footers existed (a bare zip) load
unverified.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from vaecf.errors import RunError
from vaecf.storage.safewrite import atomic_file

MAGIC = "vaecf-checkpoint-1"
FOOTER = b"VAECFSUM"
_FOOTER_LEN = len(FOOTER) + 32


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through it."""

    def __init__(self, f):
        self.f, self.h = f, hashlib.sha256()

    def write(self, b) -> int:
        self.h.update(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def save(path: str | os.PathLike, payload: dict) -> None:
    """Write `payload` (tensors, numbers, strings, containers of them) to `path`, atomically,
    into its existing directory: a run directory deleted or moved while its model trains is
    not made again holding nothing but checkpoints (RunError)."""
    path = Path(path)
    try:
        with atomic_file(path, make_parent=False) as f:
            w = _HashingWriter(f)
            torch.save({"magic": MAGIC, **payload}, w)
            f.write(FOOTER + w.h.digest())
    except FileNotFoundError:
        if path.parent.is_dir():
            raise
        raise RunError(gone(path.parent) + f"; {path.name} was not written") from None


def gone(run_dir: Path) -> str:
    """The words for a run directory that vanished under a process writing it."""
    return f"the run directory {run_dir} is gone (deleted or moved while it was being written)"


def verify(path: str | os.PathLike) -> bool:
    """Check the footer's digest; True if verified, False for a file without a footer (older
    vaecf). A mismatch raises RunError."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - _FOOTER_LEN))
        tail = f.read(_FOOTER_LEN)
        if not tail.startswith(FOOTER) or size < _FOOTER_LEN:
            # no footer: acceptable only as a complete zip (ends with its end-of-directory record)
            if len(tail) >= 22 and tail[-22:-18] == b"PK\x05\x06":
                return False
            raise RunError(
                f"checkpoint {path} is corrupted (truncated or damaged at its end); "
                "restore it from a backup or retrain the run"
            )
        f.seek(0)
        h, left = hashlib.sha256(), size - _FOOTER_LEN
        while left > 0:
            block = f.read(min(left, 1 << 22))
            if not block:
                break
            h.update(block)
            left -= len(block)
    if h.digest() != tail[len(FOOTER) :]:
        raise RunError(
            f"checkpoint {path} is corrupted (its SHA-256 does not match the one written with "
            "it: truncated, bit-flipped or edited); restore it from a backup or retrain the run"
        )
    return True


def footer_digest(path: str | os.PathLike) -> str | None:
    """The SHA-256 (hex) written in a checkpoint's footer, read without reading the file; None
    for a file without a footer (or none at all). It names the weights, not a check of them."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _FOOTER_LEN))
            tail = f.read(_FOOTER_LEN)
    except OSError:
        return None
    return (
        tail[len(FOOTER) :].hex() if len(tail) == _FOOTER_LEN and tail.startswith(FOOTER) else None
    )


def load(path: str | os.PathLike, map_location="cpu") -> dict:
    """Verify and load a checkpoint written by `save`; RunError names the file and what to do.
    The digest is checked in a thread while torch reads (hashing releases the GIL): a load
    takes about the longer of the two, not their sum. Nothing is returned unless the digest
    matched, and where both fail the digest's words are the ones raised."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"checkpoint {path} is missing; is this a finished vaecf run directory?")
    with ThreadPoolExecutor(1) as pool:
        verified = pool.submit(verify, path)
        try:
            obj = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as e:
            verified.result()
            raise RunError(
                f"checkpoint {path} is corrupted or not a vaecf checkpoint ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200] if str(e) else ''}); restore it or retrain the run"
            ) from None
        verified.result()
    if not isinstance(obj, dict) or obj.get("magic") != MAGIC:
        raise RunError(f"{path} is not a vaecf checkpoint; restore it or retrain the run")
    return obj
