"""Memory: what is free on a device, for a person, and which items fit when only some do (what
each part holds is worked out beside it: vaecf.footprint, vaecf.models.linear, models.infae)."""

from __future__ import annotations

import os

import numpy as np
import torch

GiB = 2**30


def available_bytes(device: torch.device) -> int:
    """Memory free for new arrays on `device` (MemAvailable on the host)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def items_cut(item_users: np.ndarray, fits: int) -> tuple[int, int]:
    """(cut, kept): the smallest per-item user count whose items fit when `fits` items do (ties
    at the cut are all dropped), and how many items have at least that many users."""
    cut = int(np.sort(item_users)[::-1][fits]) + 1
    return cut, int((item_users >= cut).sum())


def gib(n: float) -> str:
    """`n` bytes for a person: GiB from 1 GiB up, else MiB."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def local_processes() -> int:
    """Training processes on this machine under torchrun (1 otherwise)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
