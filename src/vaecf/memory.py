"""Memory: what is free on a device and what limits it, one way of saying what a fit needs and
refusing it, for a person, and which items fit when only some do (what each part holds is worked
out beside it: vaecf.training.footprint, vaecf.models.linear, models.infae).

On the host the free memory is the least of three: the kernel's MemAvailable, what the process's
address-space limit (`ulimit -v`, RLIMIT_AS) leaves above its present size (less what the
compute threads reserve when they start: glibc maps a 64 MiB arena and an 8 MiB stack for each,
address space the limit counts though little of it is ever touched), and what its cgroup's
memory limit (v2 `memory.max`, v1 `memory.limit_in_bytes`, at every level up to the root) leaves
above the group's use, less the file cache the kernel can drop. A check that read MemAvailable
alone passed under a container's limit, and the allocation then died without a word.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

GiB = 2**30
UNLIMITED = 1 << 62  # a cgroup "limit" at or above this is none (v1 writes 2^63 - 4096)
THREAD_ADDRESS_SPACE = 72 * 2**20  # a compute thread's malloc arena and stack, mapped at its start


class Free(NamedTuple):
    """Bytes free for new arrays on a device, and what set that figure."""

    bytes: int
    limit: str  # "MemAvailable", "ulimit -v", "the cgroup's memory limit" or "the GPU"


def free_memory(device: torch.device) -> Free:
    """What `device` has free for new arrays (see the module's docstring)."""
    if device.type == "cuda":
        return Free(torch.cuda.mem_get_info(device)[0], "the GPU")
    found = [Free(mem_available(), "MemAvailable")]
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        threads = torch.get_num_threads() * THREAD_ADDRESS_SPACE
        found.append(Free(max(soft - _vm_size() - threads, 0), "ulimit -v"))
    group = cgroup_room()
    if group is not None:
        found.append(Free(group, "the cgroup's memory limit"))
    return min(found, key=lambda f: f.bytes)


def available_bytes(device: torch.device) -> int:
    """Memory free for new arrays on `device` (`free_memory`'s figure)."""
    return free_memory(device).bytes


def mem_available() -> int:
    kib = _proc_kib("/proc/meminfo", "MemAvailable")
    if kib is not None:
        return kib * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _vm_size() -> int:
    """This process's address space now (what RLIMIT_AS counts)."""
    return (_proc_kib("/proc/self/status", "VmSize") or 0) * 1024


def _proc_kib(path: str, key: str) -> int | None:
    """The "key:  N kB" line's N in a /proc file, or None where there is none."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def cgroup_room(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")):
    """Bytes this process's cgroup (and each group above it) lets it add, or None without a
    limit: the tightest level's limit minus its use, the droppable file cache not counted."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (root / "cgroup.controllers").is_file():  # v2
            files = ("memory.max", "memory.current", "inactive_file")
            base = root
        elif "memory" in controllers.split(","):  # v1
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            base = root / "memory"
        else:
            continue
        level = base / path.lstrip("/")
        while True:
            room = _cgroup_level(level, *files)
            if room is not None:
                rooms.append(room)
            if level == base or base not in level.parents:
                break
            level = level.parent
    return min(rooms) if rooms else None


def _cgroup_level(level: Path, limit_file: str, use_file: str, cache_key: str) -> int | None:
    try:
        limit = (level / limit_file).read_text().strip()
        if limit == "max" or int(limit) >= UNLIMITED:
            return None
        use = int((level / use_file).read_text())
        cache = 0
        for line in (level / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == cache_key:
                cache = int(value)
    except (OSError, ValueError):
        return None
    return max(int(limit) - max(use - cache, 0), 0)


def statement(what: str, need: int, free: Free, device: torch.device) -> str:
    """One line for a plan: what will be held, of what is free and what set that figure."""
    return f"{what}: about {gib(need)} of {gib(free.bytes)} free on {device} ({free.limit})"


def refusal(
    what: str, need: int, free: Free, device: torch.device, advice: list[str], parts: str = ""
) -> str:
    """What every model's refusal says (a RunError, raised before anything large is
    allocated): the figures (`parts`: what makes up the need), what set the free one, and each
    change that would make it fit."""
    return (
        f"{what} needs about {gib(need)}{parts} but {device} has {gib(free.bytes)} free "
        f"({free.limit}); " + "; or ".join(advice)
    )


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
