"""Checkpoint writes off the training loop: snapshot now, serialise and fsync in the background.

`snapshot(obj)` copies every tensor of a nested state (model, optimizers, RNG) to host memory,
so training may go on changing the originals. `CheckpointWriter` writes snapshots one at a time,
in submission order, on one background thread, each atomically
(vaecf.storage.checkpoint.save): never two writes at once, and a later file never lands before
an earlier one (best.pt before the last.pt that records it). A failed write is raised in the
training thread at the next submit or at `close()`. It counts the bytes and the seconds the
training thread waited.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

import torch

from vaecf.storage import checkpoint


def snapshot(obj):
    """A copy of a nested structure with every tensor cloned to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, snapshot(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v) for v in obj)
    return obj


class CheckpointWriter:
    def __init__(self, depth: int = 2):
        self._jobs: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self.bytes_written = 0
        self.writes = 0
        self.wait_seconds = 0.0  # time the training thread spent blocked here
        self._thread = threading.Thread(target=self._work, name="vaecf-checkpoint", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            path, payload = job
            try:
                if self._error is None:
                    checkpoint.save(path, payload)
                    self.bytes_written += os.path.getsize(path)
                    self.writes += 1
            except BaseException as e:  # handed to the training thread
                self._error = e
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def submit(self, path: str | os.PathLike, payload: dict) -> None:
        """Queue a snapshot (already copied: see `snapshot`) for writing to `path`."""
        self._raise()
        t0 = time.perf_counter()
        self._jobs.put((Path(path), payload))
        self.wait_seconds += time.perf_counter() - t0

    def write_now(self, path: str | os.PathLike, payload: dict) -> None:
        """Write `payload` (live tensors, no copy) to `path` in the calling thread, after
        every submitted write."""
        self.flush()
        t0 = time.perf_counter()
        checkpoint.save(Path(path), payload)
        self.wait_seconds += time.perf_counter() - t0
        self.bytes_written += os.path.getsize(path)
        self.writes += 1

    def flush(self) -> None:
        """Wait until every submitted write is on disk; raise a failed write's error."""
        t0 = time.perf_counter()
        self._jobs.join()
        self.wait_seconds += time.perf_counter() - t0
        self._raise()

    def close(self) -> None:
        if self._thread.is_alive():
            self.flush()
            self._jobs.put(None)
            self._thread.join()
        self._raise()
