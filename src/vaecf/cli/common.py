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


def metrics_table(rows: dict[str, dict], keys=("recall@20", "recall@50", "ndcg@100")) -> str:
    """A table of `keys` (the metrics each row has) for each named row."""
    width = max([14, *(len(name) + 2 for name in rows)])
    keys = [k for k in keys if any(k in m for m in rows.values())]
    lines = [" " * width + "".join(f"{k:>13s}" for k in keys)]
    for name, m in rows.items():
        cells = "".join(f"{m[k]:13.4f}" if k in m else f"{'':13s}" for k in keys)
        lines.append(f"{name:{width}s}" + cells)
    return "\n".join(lines)
