"""EASE kept current by the rows that changed: the run's inverse updated (Woodbury) instead of
X^T X and a solve again.

A dense EASE fit keeps diag P beside B (`inverse_diag`), P = (X^T X + lambda I)^-1, and B =
I - P diagMat(1/diag P) gives P back: P = (I - B) diagMat(diag P). A newer preparation of the
same data changes X^T X by whole rows, compared as sets of items (not by user: a history that
grew is one row removed and one added; a user who moved between splits moved a row): those
only in the newer rows are added to P (P -= V^T V, V = L^-1 U P, L L^T = I + U P U^T, for the
rows U), then those only in the older ones removed (the same with the signs turned: I - U P U^T
is positive definite because X^T X stays so without them). A new item enters P at 1 / lambda
(no older row holds it); an item the newer data lost is decoupled once its rows are gone and
dropped. Exact to float rounding: the B of a solve on the newer rows, found in ~2 n^2 r flops
for r changed rows (products at the CPU's best rate) against X^T X and the solve's n^3 (a
factorisation and an inverse, slower per flop): taken up to twice the solve's flops (r ~ 0.73
n). On ML-1M by time, 80% -> all (1,277 rows added and 298 removed for 3,468 items: 0.45 n)
it fitted in 0.74-1.03 s against X^T X and the solve's 1.32-2.82 (probe_ease_rows_route in
benchmarks/README.md); each twentieth of the interactions changes 355-703 rows. A random
split's preparations draw their held-out users anew, moving most rows: there the solve runs.
EASE only: EDLAE's dropout adds p/(1-p) diag(X^T X) to the ridge, which moves with every count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from vaecf.data.matrix import SparseBatch
from vaecf.models import linalg
from vaecf.models.linear import sparse_rows

KEY_SEED = 20261129  # the random 64-bit item keys whose sums name a row's set of items
SOLVE_FLOPS = 2.0  # the update's flops may be this many times the solve's n^3 (see above)


def inverse_diag(gram: torch.Tensor, b: torch.Tensor, l2: float, scale: torch.Tensor):
    """diag P, P = (gram + l2 I)^-1, from EASE's B (column j multiplied by `scale[j]`, the
    popularity penalty): 1 / P_ii = gram_ii + l2 - sum_k gram_ki B_ki (gram is symmetric), the
    diagonal of (gram + l2 I) (I - B) diagMat(diag P) = I. In row blocks: no third n^2 array."""
    n, step = gram.shape[0], max(1, 2**22 // max(1, gram.shape[0]))
    gb = torch.zeros(n, dtype=torch.float64, device=gram.device)
    for s in range(0, n, step):
        gb += (gram[s : s + step] * b[s : s + step]).sum(0)  # a block in its own dtype
    return (1.0 / (gram.diagonal().double() + l2 - gb / scale.double())).to(b.dtype)


@dataclass
class Inverse:
    """An EASE run's inverse as it keeps it: `weights()` reads B (its popularity penalty taken
    out; overwritten by P) and diag P at lambda `l2` (None: the run keeps no diag P); the rows
    its X^T X held (binary CSR over its items), and each newer item's index among its items
    (-1: new)."""

    weights: Callable[[], tuple[torch.Tensor, torch.Tensor] | None]
    l2: float
    rows: sp.csr_matrix
    pos: np.ndarray
    why: str = "an update by rows runs on the CPU, for one dense B"  # why it did not, if not

    def tried(
        self, x: sp.csr_matrix, l2: float, dense_cpu: bool, log: Callable[[str], None] | None
    ):
        """`updated(x, l2)` where the route runs (one dense B on the CPU), else None; what it
        did said to `log`."""
        got = self.updated(x, l2) if dense_cpu else None
        if log:
            log(f"EASE: {self.said(got)}")
        return got

    def said(self, got: tuple[torch.Tensor, int, int] | None) -> str:
        """What the update did, in words for its log: `got` is what `updated` returned."""
        if got is None:
            return f"solved again: {self.why}"
        return (f"the run's inverse updated by the rows of X^T X that changed ({got[1]:,} added, "
                f"{got[2]:,} removed) in place of the solve")  # fmt: skip

    def updated(self, x: sp.csr_matrix, l2: float) -> tuple[torch.Tensor, int, int] | None:
        """P = (x^T x + l2 I)^-1 for the newer rows `x` (over the newer items), from the run's
        by the rows that changed, with the numbers of rows added and removed; None where the
        rows are not sets of items, lambda is another, a solve costs less or the run keeps no
        diag P. The run's weights are read only where the change is small enough."""
        n_new, n_old = len(self.pos), self.rows.shape[1]
        if l2 != self.l2 or not (np.all(x.data == 1) and np.all(self.rows.data == 1)):
            self.why = f"lambda {l2:g} is not the run's {self.l2:g}, or the rows are weighted"
            return None
        # the union of both item sets: the newer items, then those only the run had
        to_union = np.full(n_old, -1, dtype=np.int64)
        to_union[self.pos[self.pos >= 0]] = np.flatnonzero(self.pos >= 0)
        lost = np.flatnonzero(to_union < 0)
        to_union[lost] = n_new + np.arange(len(lost))
        n = n_new + len(lost)
        old = sp.csr_matrix((self.rows.data, to_union[self.rows.indices], self.rows.indptr),
                            shape=(self.rows.shape[0], n))  # fmt: skip
        new = sp.csr_matrix((x.data, x.indices, x.indptr), shape=(x.shape[0], n))
        added, removed = changed(old, new)
        r = len(added) + len(removed)
        if 2 * n * n * r + n * r * r > SOLVE_FLOPS * n**3:  # the update's flops against the solve's
            self.why = (
                f"{len(added):,} rows of X^T X added, {len(removed):,} removed: solving costs less"
            )
            return None
        if (got := self.weights()) is None:
            self.why = "the run's B is sparse (no diag P)"
            return None
        p_old, d = got
        p_old.neg_().diagonal().add_(1.0)  # P = (I - B) diagMat(d), in B's memory
        p_old.mul_(d.to(p_old.dtype))
        p, got, p_old = placed(p_old, to_union, n), None, None
        p.diagonal()[np.setdiff1d(np.arange(n), to_union)] = 1.0 / l2  # a new item's
        try:
            for u, sign in ((new[added], 1.0), (old[removed], -1.0)):
                if u.shape[0]:
                    update_by_rows_(p, u, sign)
        except linalg.NotPositiveDefinite:
            self.why = "float rounding took a removal of rows past positive definite"
            return None
        return (p if n == n_new else p[:n_new, :n_new].clone()), len(added), len(removed)


def placed(p_old: torch.Tensor, at: np.ndarray, n: int) -> torch.Tensor:
    """An n x n matrix holding `p_old` at rows and columns `at`, zeros elsewhere: `p_old`
    itself or padded where the newer data lists the run's items first and in order (items are
    numbered as they first appear, so a later export of the same source does); else by blocks
    of rows, with no n^2 index arrays."""
    if np.array_equal(at, np.arange(len(at))):
        return p_old if n == len(at) else torch.nn.functional.pad(p_old, (0, n - len(at)) * 2)
    p, pos, step = torch.zeros(n, n, dtype=p_old.dtype), torch.from_numpy(at), max(1, 2**22 // n)
    for s in range(0, len(at), step):
        block = torch.zeros(len(pos[s : s + step]), n, dtype=p.dtype)
        p.index_copy_(0, pos[s : s + step], block.index_copy_(1, pos, p_old[s : s + step]))
    return p


def changed(old: sp.csr_matrix, new: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """(rows of `new` not in `old`, rows of `old` not in `new`), rows compared as sets of
    columns, with their multiplicities: each row named by its length and the sum of random
    64-bit keys of its columns (two different sets share a name with probability ~2^-64)."""
    keys = np.random.default_rng(KEY_SEED).integers(0, 2**63, old.shape[1], dtype=np.uint64)

    def names(m: sp.csr_matrix) -> np.ndarray:
        lens = np.diff(m.indptr)
        sums = np.zeros(m.shape[0], dtype=np.uint64)
        full = lens > 0
        sums[full] = np.add.reduceat(keys[m.indices], m.indptr[:-1][full])
        return np.stack([lens.astype(np.uint64), sums], axis=1)

    both = np.concatenate([names(old), names(new)])
    ids = np.unique(both, axis=0, return_inverse=True)[1].reshape(-1)  # one number per name
    a, b = ids[: old.shape[0]], ids[old.shape[0] :]
    count_a, count_b = np.bincount(a, minlength=len(both)), np.bincount(b, minlength=len(both))
    return firsts(b, count_b - count_a), firsts(a, count_a - count_b)


def firsts(ids: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """The positions of `ids` that are among the first `quota[i]` occurrences of their id i."""
    order = np.argsort(ids, kind="stable")
    ranked = ids[order]
    rank = np.empty(len(ids), dtype=np.int64)
    rank[order] = np.arange(len(ids)) - np.searchsorted(ranked, ranked)
    return np.flatnonzero(rank < quota[ids])


def update_by_rows_(p: torch.Tensor, u: sp.csr_matrix, sign: float) -> None:
    """p <- (p^-1 + sign u^T u)^-1 in place, for binary rows u (p symmetric): u p is the sum of
    p's rows at each row's items, u p u^T the same of (u p)'s columns."""
    lens = torch.from_numpy(np.diff(u.indptr)).long()
    batch = SparseBatch.of_flat(torch.from_numpy(u.indices).long(), lens)
    w = sparse_rows(p, batch)  # (r, n): U P
    s = sparse_rows(w.T.contiguous(), batch).mul_(sign)  # (r, r): sign U P U^T
    s.diagonal().add_(1.0)
    linalg.inverse_update_(p, w, s, sign)
