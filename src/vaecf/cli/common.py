"""What every verb module shares: the data root, JSON output, metric tables, names and ids made
safe to print."""

from __future__ import annotations

import json
import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("VAECF_HOME") or Path.home() / ".cache" / "vaecf")


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def printable(value) -> str:
    """An item's or user's id or name as text to print: control characters (ESC, which can set a
    terminal's title and colours; newlines, which forge lines) and other characters that do not
    print (bidi overrides, zero-width) as Python escapes (\\x1b, \\n, \\u202e); --json keeps the
    exact text."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def metrics_table(rows: dict[str, dict]) -> str:
    keys = ["recall@20", "recall@50", "ndcg@100"]
    lines = [f"{'':14s}" + "".join(f"{k:>12s}" for k in keys)]
    for name, m in rows.items():
        lines.append(f"{name:14s}" + "".join(f"{m[k]:12.4f}" for k in keys))
    return "\n".join(lines)
