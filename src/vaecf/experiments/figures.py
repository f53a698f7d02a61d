"""What every picture shares: matplotlib on its Agg backend (no display needed), and an atomic
write of a figure."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: Path) -> Path:
    """Write `fig` to `path` (the format its suffix names; PNG, and a .png suffix, without one)
    atomically: a process killed while drawing leaves the previous picture, never a torn one."""
    from vaecf.storage.safewrite import atomic_file

    if not path.suffix:
        path = path.with_name(path.name + ".png")
    with atomic_file(path) as f:
        fig.savefig(f, format=path.suffix[1:].lower(), dpi=110)
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
