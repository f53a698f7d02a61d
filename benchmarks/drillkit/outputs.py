"""What a drill's output holds, file by file: whole-file digests, temp and lock leftovers.

A state function raises `Broken` for anything unreadable under a final name; the helpers here
digest one file (`file_digest`: it must parse) or a tree, and list or clear an output's entries.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path


class Broken(Exception):
    """The output holds something unreadable or inconsistent: a mixture, a partial file."""


def leftovers(directory: Path, names: Sequence[str]) -> list[str]:
    """Entries of `directory` that are temp or lock files of writes to `names`."""
    if not directory.is_dir():
        return []
    return sorted(
        p.name for p in directory.iterdir() if any(p.name.startswith(f".{n}.") for n in names)
    )


PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def file_digest(path: Path) -> str | None:
    """sha256 of a file that must be whole: None if absent; Broken if it does not parse (JSON,
    CSV with every row as long as the header, PNG through its IEND chunk, TOML)."""
    import csv
    import tomllib

    if not path.exists():
        return None
    data = path.read_bytes()
    try:
        if path.suffix == ".json":
            json.loads(data)
        elif path.suffix == ".csv":
            rows = list(csv.reader(data.decode().splitlines()))
            if not rows or any(len(r) != len(rows[0]) for r in rows) or not data.endswith(b"\n"):
                raise ValueError("a row cut short")
        elif path.suffix == ".png":
            if not (data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(PNG_END)):
                raise ValueError(f"not a whole PNG ({len(data)} bytes)")
        elif path.suffix == ".toml":
            tomllib.loads(data.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise Broken(f"{path}: torn: {type(e).__name__}: {e}") from None
    return hashlib.sha256(data).hexdigest()


def visible(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def clear(out: Path) -> None:
    for p in [out, *out.parent.glob(f".{out.name}.*")]:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def tree_digest(dirs: Sequence[Path]) -> dict:
    """Every entry under `dirs` (hidden ones too): a file's sha256, or 'dir'."""
    out = {}
    for d in dirs:
        for p in sorted(Path(d).rglob("*")):
            out[str(p)] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out
