"""A small filesystem to fill: a tmpfs of a given size (root only), and a filler file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def can_mount() -> bool:
    return sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("mount")


class Tmpfs:
    """A tmpfs of `size` bytes mounted on a fresh directory (root only)."""

    def __init__(self, size: int, base: Path | None = None):
        self.path = Path(tempfile.mkdtemp(prefix="vaecf-tmpfs-", dir=base))
        p = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(self.path)],
            capture_output=True,
            text=True,
        )
        if p.returncode:
            os.rmdir(self.path)
            raise OSError(f"cannot mount a tmpfs: {p.stderr.strip()}")

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> Path:
        """Write a filler file so that about `leave` bytes stay free."""
        filler = self.path / "filler"
        with open(filler, "ab") as f:
            chunk = b"\0" * (1 << 16)
            while self.free() > leave + len(chunk):
                f.write(chunk)
                f.flush()
            while self.free() > leave + 4096:
                f.write(b"\0" * 4096)
                f.flush()
        return filler

    def close(self) -> None:
        subprocess.run(["umount", str(self.path)], check=False)
        with _suppress():
            os.rmdir(self.path)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)
