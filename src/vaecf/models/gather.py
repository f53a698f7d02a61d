"""The sparse solver's gathers, compiled by Numba: each item's neighbours, the runs of items
solved together (`spans`), G's entries among a set of items made dense (`Blocks`), and each
item's neighbourhood system read out of that dense block, or read and solved there
(`solve_systems`: a Cholesky factorisation of its own, no LAPACK call, so
vaecf.models.linalg's guard against OpenBLAS is not needed).

Each is one pass over what it reads, in parallel over rows (Numba's threads, as many as
PyTorch uses). Through scipy's row and column selection the dense blocks took ~75% of a sparse
solve on a power-law catalogue (10,000 items: 39 of 53 s; benchmarks/README.md, "The sparse
solver: time"), reading each selected row twice and copying it once. Compiled on first use
and cached on disk (Numba's `cache=True`), so a process pays the compilation once per
machine, not once per fit.
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp
import torch


def compiled(fn=None, *, parallel: bool = True, fastmath: bool = False):
    """`fn` compiled by Numba (a parallel loop unless `parallel` is False), cached on disk;
    where no cache directory can be written (a read-only install without a writable home;
    NUMBA_CACHE_DIR names one), compiled afresh by each process instead. Bare, or with the
    options: `@compiled(parallel=False)`."""

    def wrap(f):
        options = {"parallel": parallel, "nogil": True, "fastmath": fastmath}
        try:
            return numba.njit(cache=True, **options)(f)
        except RuntimeError:  # Numba's "cannot cache function ...: no locator available"
            return numba.njit(**options)(f)

    return wrap if fn is None else wrap(fn)


@compiled
def _rows_among(indptr, indices, data, items, pos, out):  # pragma: no cover (compiled)
    for r in numba.prange(len(items)):
        i = items[r]
        for e in range(indptr[i], indptr[i + 1]):
            c = pos[indices[e]]
            if c >= 0:
                out[r, c] = data[e]


@compiled
def _span_block(
    indptr, indices, data, span, pos, hub_pos, hub, hubs_at, hubs_idx, out
):  # pragma: no cover (compiled)
    s = len(span)
    for r in numba.prange(s + 1):
        out[r, :] = 0
    for r in numba.prange(s):  # each location written by one row's iteration: deterministic
        i = span[r]
        if hub_pos[i] >= 0:  # a hub: its hub columns from the dense block, the rest below
            for t in range(len(hubs_at)):
                out[r, hubs_at[t]] = hub[hub_pos[i], hubs_idx[t]]
            continue
        for e in range(indptr[i], indptr[i + 1]):
            c = pos[indices[e]]
            if c >= 0:
                out[r, c] = data[e]
                if hub_pos[indices[e]] >= 0:  # G symmetric: the hub's row, unread, gets it
                    out[c, r] = data[e]


@compiled
def _systems(full, p, lam, at, a, rhs):  # pragma: no cover (compiled)
    for j in numba.prange(p.shape[0]):
        for u in range(p.shape[1]):
            row = full[p[j, u]]
            for v in range(p.shape[1]):
                a[j, u, v] = row[p[j, v]]
            a[j, u, u] += lam[p[j, u]]
            rhs[j, u] = row[at[j]]


@compiled(parallel=False, fastmath=True)
def _row_entries(m, c, lo, hi):  # pragma: no cover (compiled)
    for t in range(lo, hi):  # L[c, t] = (A[c, t] - L[c, :t] . L[t, :t]) / L[t, t]
        s = m[c, t]
        for q in range(t):
            s -= m[c, q] * m[t, q]
        m[c, t] = s / m[t, t]


@compiled(parallel=False, fastmath=True)
def _factor_lower(m):  # pragma: no cover (compiled)
    """m's lower triangle := its Cholesky factor (Crout, four rows at a time: each row t read
    once for four dot products); False if m is not positive definite."""
    k = m.shape[0]
    for c0 in range(0, k, 4):
        if c0 + 4 <= k:
            for t in range(c0):
                s0, s1, s2, s3 = m[c0, t], m[c0 + 1, t], m[c0 + 2, t], m[c0 + 3, t]
                for q in range(t):
                    w = m[t, q]
                    s0 -= m[c0, q] * w
                    s1 -= m[c0 + 1, q] * w
                    s2 -= m[c0 + 2, q] * w
                    s3 -= m[c0 + 3, q] * w
                d = m[t, t]
                m[c0, t], m[c0 + 1, t], m[c0 + 2, t], m[c0 + 3, t] = s0 / d, s1 / d, s2 / d, s3 / d
        else:
            for c in range(c0, k):
                _row_entries(m, c, 0, c0)
        for c in range(c0, min(c0 + 4, k)):  # the diagonal block
            _row_entries(m, c, c0, c)
            d = m[c, c]
            for q in range(c):
                d -= m[c, q] * m[c, q]
            if not d > 0:
                return False
            m[c, c] = np.sqrt(d)
    return True


@compiled(fastmath=True)
def _solve_systems(full, p, lam, at, out, failed):  # pragma: no cover (compiled)
    k = p.shape[1]
    for j in numba.prange(p.shape[0]):
        m = np.empty((k, k), dtype=full.dtype)  # the lower triangle: gathered, then factored
        for u in range(k):
            row = full[p[j, u]]
            for v in range(u + 1):
                m[u, v] = row[p[j, v]]
            m[u, u] += lam[p[j, u]]
        if not _factor_lower(m):
            failed[j] = True
            continue
        y = np.empty(k, dtype=full.dtype)
        for c in range(k):  # L y = rhs
            s = full[p[j, c], at[j]]
            for q in range(c):
                s -= m[c, q] * y[q]
            y[c] = s / m[c, c]
        for c in range(k - 1, -1, -1):  # L^T b = y, by L's rows
            b = y[c] / m[c, c]
            out[j, c] = b
            for q in range(c):
                y[q] -= b * m[c, q]


@compiled(parallel=False)
def _next_span(
    items, nbrs, order, start, limit, max_items, span_mark, row_mark, tag, counter
):  # pragma: no cover (compiled)
    m, k = len(order), nbrs.shape[1]
    members = np.empty(max(limit, k + 1), dtype=np.int64)  # the first row, or within limit
    size, stop = 0, start
    while stop < m and stop - start < max_items:
        r = order[stop]
        counter += 1  # this row's own mark: the padding repeats within a row
        more = 0
        for t in range(k + 1):
            i = items[r] if t == k else nbrs[r, t]
            if span_mark[i] != tag and row_mark[i] != counter:
                row_mark[i] = counter
                more += 1
        if stop > start and size + more > limit:
            break
        for t in range(k + 1):
            i = items[r] if t == k else nbrs[r, t]
            if span_mark[i] != tag:
                span_mark[i] = tag
                members[size] = i
                size += 1
        stop += 1
    return stop, np.sort(members[:size]), counter


@compiled
def _top(indptr, indices, data, items, weight, out, strongest):  # pragma: no cover (compiled)
    k = out.shape[1]
    for r in numba.prange(len(items)):
        j = items[r]
        lo, hi = indptr[j], indptr[j + 1]
        cols = indices[lo:hi]
        by_col = np.arange(hi - lo)
        for e in range(1, hi - lo):
            if cols[e] < cols[e - 1]:  # unsorted row: read it in column order
                by_col = np.argsort(cols, kind="mergesort")
                break
        m, best = 0, -np.inf
        keep = np.empty(hi - lo, dtype=np.int64)  # the row's entries but j, in column order
        for e in by_col:
            if cols[e] != j:
                keep[m] = e
                m += 1
                if data[lo + e] > best:  # the first of the largest: lowest index
                    best, strongest[r] = data[lo + e], cols[e]
        score = np.empty(m)
        for t in range(m):
            score[t] = -(np.float64(data[lo + keep[t]]) * weight[cols[keep[t]]])
        # the k lowest scores, ties to the lower column: all below the k-th lowest, then
        # those equal to it in column order
        cut = np.partition(score, k - 1)[k - 1] if m > k else np.inf
        below = 0
        for t in range(m):
            below += score[t] < cut
        ties, n_out = k - below, 0
        for t in range(m):
            if score[t] < cut or (score[t] == cut and ties > 0):
                ties -= score[t] == cut
                out[r, n_out] = cols[keep[t]]
                n_out += 1


@compiled
def _gram_counts(tp, ti, p, i, chunks, counts):  # pragma: no cover (compiled)
    n = len(counts)
    for c in numba.prange(chunks):
        seen = np.full(n, -1, dtype=np.int64)
        for a in range(c, n, chunks):
            m = 0
            for e in range(tp[a], tp[a + 1]):
                u = ti[e]
                for f in range(p[u], p[u + 1]):
                    if seen[i[f]] != a:
                        seen[i[f]] = a
                        m += 1
            counts[a] = m


@compiled
def _gram_fill(tp, ti, td, p, i, d, chunks, zero, op, oi, od):  # pragma: no cover (compiled)
    n = len(op) - 1
    for c in numba.prange(chunks):
        seen = np.full(n, -1, dtype=np.int64)
        acc = zero.copy()
        for a in range(c, n, chunks):
            start, m = op[a], 0
            for e in range(tp[a], tp[a + 1]):  # users of item a, in order: scipy's sum order
                u, v = ti[e], td[e]
                for f in range(p[u], p[u + 1]):
                    b = i[f]
                    if seen[b] != a:
                        seen[b] = a
                        acc[b] = 0
                        oi[start + m] = b
                        m += 1
                    acc[b] += v * d[f]
            cols = np.sort(oi[start : start + m])
            for t in range(m):
                oi[start + t] = cols[t]
                od[start + t] = acc[cols[t]]


def threads() -> None:
    """Numba's threads held to PyTorch's count (the process's CPU budget)."""
    numba.set_num_threads(max(1, min(numba.config.NUMBA_NUM_THREADS, torch.get_num_threads())))


def top_neighbours(gram, items: np.ndarray, k: int, weight: np.ndarray):
    """(len(items), k) each item's k other items of highest G_ij weight_i (ties: lower index
    first; in index order, padded with n_items where it co-occurs with fewer), and each one's
    most co-occurring item (itself where it co-occurs with none)."""
    items = items.astype(np.int64)
    out = np.full((len(items), k), gram.shape[0], dtype=np.int64)
    strongest = items.copy()
    threads()
    _top(gram.indptr, gram.indices, gram.data, items, weight.astype(np.float64), out, strongest)
    return out, strongest


def _gram_lengths(x: sp.csr_matrix):
    """(X as CSR with sorted indices, X^T's rows (each item's users, in order), the chunks of
    items the threads share, each row's length in X^T X): the first of `gram`'s passes."""
    x = x.tocsr()
    x.sort_indices()
    t = x.tocsc()
    t.sort_indices()
    chunks = 64 * max(1, torch.get_num_threads())  # interleaved items: popular ones spread out
    counts = np.zeros(x.shape[1], dtype=np.int64)
    threads()
    _gram_counts(t.indptr, t.indices, x.indptr, x.indices, chunks, counts)
    return x, t, chunks, counts


def gram_entries(x: sp.csr_matrix) -> int:
    """The number of entries of X^T X (pairs of items in some history, each once), counted
    without making it."""
    return int(_gram_lengths(x)[3].sum())


def gram(x: sp.csr_matrix) -> sp.csr_matrix:
    """X^T X as a CSR matrix with sorted indices, as scipy's product gives it (the same sums in
    the same order; explicit zeros dropped), its rows computed in parallel: two passes over
    each item's users' histories (the row's length, then its sums)."""
    x, t, chunks, counts = _gram_lengths(x)
    n = x.shape[1]
    total = int(counts.sum())
    index = np.int32 if total < 2**31 else np.int64  # scipy's choice, so it copies nothing
    indptr = np.zeros(n + 1, dtype=index)
    np.cumsum(counts, out=indptr[1:])
    indices = np.empty(total, dtype=index)
    data = np.empty(total, dtype=x.dtype)
    zero = np.zeros(n, dtype=x.dtype)
    _gram_fill(t.indptr, t.indices, t.data, x.indptr, x.indices, x.data, chunks, zero,
               indptr, indices, data)  # fmt: skip
    out = sp.csr_matrix((data, indices, indptr), shape=(n, n))
    out.eliminate_zeros()
    return out


def rows_among(gram, items: np.ndarray, out: np.ndarray) -> None:
    """out[:len(items), :len(items)] = G[items, items] for a CSR G with no duplicate entries
    (`items` distinct; `out` zero there beforehand)."""
    pos = np.full(gram.shape[1], -1, dtype=np.int64)
    pos[items] = np.arange(len(items))
    threads()
    _rows_among(gram.indptr, gram.indices, gram.data, items.astype(np.int64), pos, out)


class Blocks:
    """G[span, span] for one span after another, G a symmetric CSR matrix without duplicate
    entries. The `hubs` items of longest rows (the most popular, in nearly every span) have
    their block among themselves made dense once and their rows never read again: each other
    row of a span, read once, also fills the hubs' rows (G's symmetry)."""

    def __init__(self, gram, dtype, hubs: int):
        n = gram.shape[0]
        h = min(hubs, n)
        top = np.sort(np.lexsort((np.arange(n), -np.diff(gram.indptr)))[:h])
        self.gram = gram
        self.hub_pos = np.full(n, -1, dtype=np.int64)
        self.hub_pos[top] = np.arange(h)
        self.hub = np.zeros((h, h), dtype=dtype)
        rows_among(gram, top, self.hub)
        self.pos = np.full(n, -1, dtype=np.int64)
        self.buf = np.empty(0, dtype=dtype)

    def dense(self, span: np.ndarray) -> np.ndarray:
        """(len(span) + 1)^2: G[span, span] (`span` distinct), then a zero row and column;
        its memory is the next call's."""
        s = len(span) + 1
        if self.buf.size < s * s:
            self.buf = np.empty(s * s, dtype=self.hub.dtype)
        out = self.buf[: s * s].reshape(s, s)
        span = span.astype(np.int64)
        self.pos[span] = np.arange(len(span))
        hubs_at = np.flatnonzero(self.hub_pos[span] >= 0)
        g = self.gram
        threads()
        _span_block(g.indptr, g.indices, g.data, span, self.pos, self.hub_pos, self.hub,
                    hubs_at, self.hub_pos[span[hubs_at]], out)  # fmt: skip
        self.pos[span] = -1
        return out


def systems(full: np.ndarray, p: np.ndarray, lam: np.ndarray, at: np.ndarray):
    """Per row j of the positions `p` (J, k) into the dense symmetric `full`: the system
    (full[p_j, p_j] + diag(lam[p_j])) and its right-hand side full[p_j, at_j], as (J, k, k)
    and (J, k) arrays of `full`'s dtype."""
    j, k = p.shape
    a = np.empty((j, k, k), dtype=full.dtype)
    rhs = np.empty((j, k), dtype=full.dtype)
    threads()
    _systems(full, p, lam.astype(full.dtype), at, a, rhs)
    return a, rhs


def solve_systems(full: np.ndarray, p: np.ndarray, lam: np.ndarray, at: np.ndarray):
    """(J, k) the solutions b_j of the systems `systems` would build, each gathered into a
    thread's own k x k buffer, Cholesky-factored and solved there (no (J, k, k) array; for k
    whose buffer stays in a core's cache); None if one of them is not positive definite."""
    out = np.empty(p.shape, dtype=full.dtype)
    failed = np.zeros(p.shape[0], dtype=np.bool_)
    threads()
    _solve_systems(full, p, lam.astype(full.dtype), at, out, failed)
    return None if failed.any() else out


def spans(items, nbrs, order, limit: int, max_items: int, n: int):
    """Runs of `order` (rows of `items` and their `nbrs`, padded with n), at most `max_items`
    long, whose items' neighbourhoods (and the items) span at most `limit` items, the padding
    counted as one (a single item always forms a run): each run's rows of `order` and its
    span's items, sorted, without the padding."""
    span_mark = np.full(n + 1, -1, dtype=np.int64)
    row_mark = np.full(n + 1, -1, dtype=np.int64)
    items, nbrs, order = (a.astype(np.int64) for a in (items, nbrs, order))
    start, tag, counter = 0, 0, 0
    while start < len(order):
        stop, span, counter = _next_span(items, nbrs, order, start, limit, max_items,
                                         span_mark, row_mark, tag, counter)  # fmt: skip
        yield order[start:stop], span[span != n]
        start, tag = stop, tag + 1
