"""CSR user x item matrices: scipy files on disk, torch tensors on the device, sliced into batches.

A batch never densifies the input: it is the CSR rows of its users as (indices, offsets, values),
plus the row id of every non-zero for segment sums.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, fields

import numpy as np
import scipy.sparse as sp
import torch

from vaecf.storage.safewrite import load_csr, save_csr  # noqa: F401  (CSR <-> disk, torch-free)


@dataclass
class SparseBatch:
    """Rows of a CSR matrix for a batch of B users."""

    indices: torch.Tensor  # (nnz,) int64 item index of every non-zero
    offsets: torch.Tensor  # (B,) int64 start of each user's non-zeros in `indices`
    values: torch.Tensor  # (nnz,) float32 value of every non-zero
    row_ids: torch.Tensor  # (nnz,) int64 batch row (0..B-1) of every non-zero
    batch_size: int  # B
    # (B, 2) each row's sum of values and 1 / its L2 norm, read from the matrix's own (a CUDA
    # graph's batch: CSR.padded_batch); None: computed from the values when asked
    row_stats: torch.Tensor | None = None

    @classmethod
    def of_flat(
        cls, indices: torch.Tensor, lens: torch.Tensor, device: torch.device | str = "cpu"
    ) -> SparseBatch:
        """A batch of ones: row r is the next `lens[r]` entries of `indices` (item indices,
        distinct within a row)."""
        return cls(
            indices=indices.to(device),
            offsets=(torch.cumsum(lens, 0) - lens).to(device),
            values=torch.ones(len(indices), device=device),
            row_ids=torch.repeat_interleave(torch.arange(len(lens)), lens).to(device),
            batch_size=len(lens),
        )

    @classmethod
    def of_rows(cls, rows, device: torch.device | str = "cpu") -> SparseBatch:
        """Histories given as item indices (lists or tensors; each row distinct items) as a
        batch of ones."""
        lens = torch.tensor([len(r) for r in rows], dtype=torch.long)
        parts = [torch.as_tensor(r, dtype=torch.long).reshape(-1) for r in rows]
        indices = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
        return cls.of_flat(indices, lens, device)

    def to(self, device: torch.device, pin: bool = False) -> SparseBatch:
        """A copy on `device`; with `pin`, staged through pinned memory (asynchronous copy)."""
        moved = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                v = (v.pin_memory() if pin else v).to(device, non_blocking=pin)
            moved[f.name] = v
        return SparseBatch(**moved)

    def row_sums(self, values: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) sum of `values` (default: the batch's values) per row."""
        if values is None and self.row_stats is not None:
            return self.row_stats[:, 0]
        v = self.values if values is None else values
        out = torch.zeros(self.batch_size, dtype=v.dtype, device=v.device)
        return out.index_add_(0, self.row_ids, v)

    def inverse_norms(self) -> torch.Tensor:
        """(B,) 1 / each row's L2 norm (1e6 for an empty row), as tf.nn.l2_normalize scales."""
        if self.row_stats is not None:
            return self.row_stats[:, 1]
        v = self.values
        return torch.rsqrt(self.row_sums(v * v).clamp_min(1e-12))


class CSR:
    """A CSR matrix held as torch tensors on one device, with vectorised row slicing."""

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        values: torch.Tensor,
        shape: tuple[int, int],
    ):
        self.indptr = indptr  # (n_rows + 1,) int64
        self.indices = indices  # (nnz,) int64
        self.values = values  # (nnz,) float32
        self.shape = shape
        self._row_stats: torch.Tensor | None = None  # (n_rows, 2): see row_stats
        self._row_bounds: torch.Tensor | None = None  # (n_rows, 2): see row_bounds

    @classmethod
    def from_scipy(cls, m: sp.csr_matrix, device: str | torch.device = "cpu") -> CSR:
        m = m.tocsr()
        m.sort_indices()
        return cls(
            torch.from_numpy(m.indptr.astype(np.int64)).to(device),
            torch.from_numpy(m.indices.astype(np.int64)).to(device),
            torch.from_numpy(m.data.astype(np.float32)).to(device),
            (int(m.shape[0]), int(m.shape[1])),
        )

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def nnz(self) -> int:
        return int(self.indices.numel())

    @property
    def device(self) -> torch.device:
        return self.indices.device

    def to(self, device: str | torch.device, pin: bool = False) -> CSR:
        ts = [self.indptr, self.indices, self.values]
        if pin:
            ts = [t.pin_memory() for t in ts]
        return CSR(*(t.to(device, non_blocking=pin) for t in ts), shape=self.shape)

    def row_nnz(self) -> torch.Tensor:
        """(n_rows,) number of non-zeros per row."""
        return self.indptr[1:] - self.indptr[:-1]

    def row_stats(self) -> torch.Tensor:
        """(n_rows, 2) each row's sum of values and 1 / its L2 norm (SparseBatch.row_sums and
        inverse_norms), computed once: a CUDA graph's step gathers them instead of reducing
        its batch's values (4 kernels fewer for each, and no reduction order of its own)."""
        if self._row_stats is None:
            ids = torch.repeat_interleave(
                torch.arange(self.n_rows, device=self.device), self.row_nnz(), output_size=self.nnz
            )
            batch = SparseBatch(self.indices, self.indptr[:-1], self.values, ids, self.n_rows)
            self._row_stats = torch.stack([batch.row_sums(), batch.inverse_norms()], dim=1)
        return self._row_stats

    def batch(self, rows: torch.Tensor) -> SparseBatch:
        """Gather the given rows (an int64 tensor on this matrix's device), without Python loops.
        One row on a CPU is a slice of the matrix (views, no copies): a batch-1 answer's
        latency counts every small operation."""
        if rows.numel() == 1 and rows.device.type == "cpu":
            r = int(rows)
            start, stop = int(self.indptr[r]), int(self.indptr[r + 1])
            zeros = torch.zeros(stop - start + 1, dtype=torch.long)
            return SparseBatch(
                self.indices[start:stop], zeros[:1], self.values[start:stop], zeros[1:], 1
            )
        starts = self.indptr[rows]
        lens = self.indptr[rows + 1] - starts
        offsets = torch.cumsum(lens, 0) - lens
        total = int(lens.sum())
        row_ids = torch.repeat_interleave(
            torch.arange(rows.numel(), device=rows.device), lens, output_size=total
        )
        pos = torch.arange(total, device=rows.device) - offsets[row_ids] + starts[row_ids]
        return SparseBatch(self.indices[pos], offsets, self.values[pos], row_ids, rows.numel())

    def padded_batch(self, rows: torch.Tensor, capacity: int) -> SparseBatch:
        """The rows' non-zeros in exactly `capacity` slots, with nothing read back to the host
        (what a CUDA graph of a training step needs: fixed shapes, no synchronisation). Slot s
        belongs to the row whose running length first exceeds s; slots past the batch's total
        hold item 0 with value 0 in the last row, which adds exactly zero to every sum of the
        models; each row's sum and inverse norm come from the matrix's (`row_stats`). Rows
        holding more than `capacity` non-zeros in all lose the rest: callers check the total on
        the host (`row_nnz`) first."""
        bounds = self.row_bounds()[rows]  # (B, 2): a kernel a step fewer than two gathers
        starts = bounds[:, 0]
        lens = bounds[:, 1] - starts
        ends = torch.cumsum(lens, 0)
        offsets = ends - lens
        pos = torch.arange(capacity, device=rows.device)
        row_ids = torch.searchsorted(ends, pos, right=True)
        valid = row_ids < rows.numel()
        row_ids = row_ids.clamp_max(rows.numel() - 1)
        src = ((starts - offsets)[row_ids] + pos) * valid  # slot -> non-zero (0 past the end)
        values = self.values[src] * valid  # (a product, not `where`: one kernel, not two)
        stats = self.row_stats()[rows]
        return SparseBatch(self.indices[src], offsets, values, row_ids, rows.numel(), stats)

    def row_bounds(self) -> torch.Tensor:
        """(n_rows, 2) each row's start and end in `indices`, made once."""
        if self._row_bounds is None:
            self._row_bounds = torch.stack([self.indptr[:-1], self.indptr[1:]], dim=1)
        return self._row_bounds

    def keys(self) -> torch.Tensor:
        """(nnz,) sorted int64 keys row * n_cols + col, for membership tests by searchsorted."""
        rows = torch.repeat_interleave(
            torch.arange(self.n_rows, device=self.device), self.row_nnz()
        )
        return rows * self.shape[1] + self.indices


def prefetch_batches(
    csr: CSR, row_batches: list[torch.Tensor], device: torch.device, depth: int = 2
) -> Iterator[SparseBatch]:
    """Slice `csr` (on the host) into batches in a background thread and copy them to `device`
    through pinned memory, `depth` batches ahead of the consumer."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    pin = device.type == "cuda"

    def work() -> None:
        try:
            for rows in row_batches:
                if stop.is_set():
                    return
                q.put(csr.batch(rows.cpu()).to(device, pin=pin))
            q.put(None)
        except BaseException as e:  # handed to the consumer
            q.put(e)

    t = threading.Thread(target=work, name="vaecf-prefetch", daemon=True)
    t.start()
    try:
        while (item := q.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.01)
