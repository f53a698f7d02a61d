"""EASE and EDLAE without an n_items x n_items array: the sparse solver.

EASE's column j is the ridge regression of item j's column of X on every other item's (its
zero-diagonal constraint is exactly that), and EDLAE's the same with a per-item ridge
Lambda_i = lambda + p/(1-p) G_ii. The sparse solver restricts item j's regression to its
`neighbours` nearest items N_j, by cosine G_ij / sqrt(G_ii) or by the count G_ij
(`rank_weights`; a neighbourhood-restricted EASE):

    b_j = (G[N_j, N_j] + diagMat(Lambda[N_j]))^-1 G[N_j, j],   B[N_j, j] = b_j,

so B holds at most n_items x neighbours non-zeros, G is kept sparse (its non-zeros are at most
the sum of squared history lengths), and no n_items^2 array is ever made. With every
co-occurring item as a neighbour it is the dense solution up to items that never co-occur
with j (tests/models/test_models.py compares both). The solves are batched Cholesky
factorisations of (neighbours x neighbours) systems, a block of items at a time:
O(n_items neighbours^3) time.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import torch

from vaecf.data.matrix import SparseBatch
from vaecf.errors import RunError
from vaecf.models.linalg import NotPositiveDefinite, spd_solve_batch

# a block's neighbourhoods' union at most this many items (dense G on it): building G[span,
# span] scans the span's rows of G, so a span much wider than its items' own neighbourhoods
# costs more than it saves (spans up to 8,192 took 1.6x as long: benchmarks/README.md, "The
# sparse solver: time")
BLOCK_UNION = 2048
BLOCK_SYSTEM_BYTES = 2**28  # a block's (items x k x k) systems: at most this many bytes
# systems of at most this many neighbours are solved on the CPU by one compiled pass each
# (gather.solve_systems: 3.2x the batched products at 256, gather included, and never written
# out), larger ones by batched products (a 1,024 system's 4 MiB outgrows a core's cache: the
# compiled pass 1.25x slower there; benchmarks/README.md, "The sparse solver: time")
IN_CACHE = 512
HUBS = 4096  # items whose block among themselves is kept dense (gather.Blocks): 64 MiB float32
# vaecf.models.gather (Numba) is imported where a solve needs it: loading or serving a model
# that scores through `sparse_b_rows` does not pay Numba's import (~0.3 s)


def gram_bytes(x: sp.csr_matrix, exact: bool = False) -> int:
    """Bytes of the sparse Gram X^T X (and its copy while built), 16 an entry: an upper bound
    from the sum of squared row lengths (a pair of items counted once per history that holds
    it, so several times the entries where histories overlap), or with `exact` its entries
    counted by a compiled pass over the histories (gather.gram_entries, X^T X's first pass;
    the bound where Numba cannot load, as under an address-space limit too tight for LLVM)."""
    lengths = np.diff(x.indptr).astype(np.int64)
    bound = int((lengths * lengths).sum()) * 16
    if not exact:
        return bound
    try:
        from vaecf.models import gather

        return gather.gram_entries(x) * 16
    except (ImportError, OSError, MemoryError):
        return bound


def block_bytes(n_items: int, k: int) -> int:
    """Bytes of one block's work: its dense part of G, its systems (factored in place; none
    where k <= IN_CACHE, each solved in its thread's own k x k buffer, but on a GPU), and the
    hubs' dense block every span reads."""
    return (
        min(BLOCK_SYSTEM_BYTES, n_items * k * k * 8)
        + (min(BLOCK_UNION, n_items) + 1) ** 2 * 8
        + min(HUBS, n_items) ** 2 * 8  # the hubs' dense block (gather.Blocks)
    )


def rank_weights(rank: str, diag: np.ndarray) -> np.ndarray:
    """Per item i, the factor on G_ij that ranks i as a neighbour of item j (any j):
    "count": 1 (the co-occurrence itself); "cosine": 1 / sqrt(G_ii), so that the rank is
    the norm of X_i b_ij with b_ij = G_ij / G_ii, i's coefficient were it j's only
    neighbour: how far item i alone moves j's scores."""
    if rank == "count":
        return np.ones_like(diag)
    if rank == "cosine":
        return 1.0 / np.sqrt(np.maximum(diag, 1e-12))
    raise ValueError(f"unknown neighbour rank {rank!r}")


def neighbours_of(
    gram: sp.csr_matrix, k: int, items: np.ndarray | None = None, weight: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(len(items), k) each of `items`' (default: all) k other items of highest G_ij
    weight_i (`rank_weights`; default the count G_ij; ties: lower index first; in index
    order, padded with n_items where an item co-occurs with fewer), and each one's most
    co-occurring item, whatever the rank (itself where it co-occurs with none)."""
    n = gram.shape[0]
    items = np.arange(n) if items is None else items
    from vaecf.models import gather

    return gather.top_neighbours(gram, items, k, np.ones(n) if weight is None else weight)


def dense_block(gram: sp.csr_matrix, items: np.ndarray, out: np.ndarray | None = None):
    """G[items, items] as a dense array (written into the top-left of `out` if given, zero
    there beforehand), from the rows of `items` only, in one compiled pass over them
    (`gather.rows_among`)."""
    from vaecf.models import gather

    if out is None:
        out = np.zeros((len(items), len(items)))
    gather.rows_among(gram, items, out)
    return out


def popular_tier(diag: np.ndarray, share: float) -> np.ndarray:
    """The `share` most popular items (largest G_ii; ties: lower index), sorted."""
    m = int(share * len(diag))
    return np.sort(np.lexsort((np.arange(len(diag)), -diag))[:m])


def neighbour_weights(
    x: sp.csr_matrix,
    l2: float,
    dropout: float,
    k: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    gram: sp.csr_matrix | None = None,
    popular_share: float = 0.0,
    popular_k: int = 1024,
    rank: str = "count",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """B as (indptr, indices, values) of a CSR matrix whose row i holds item i's weights
    for predicting the other items (scores = X B), float32 values. `gram` (X^T X, CSR) may
    be given to reuse it across a search. The systems are solved in `dtype`. The columns of
    the `popular_share` most popular items are solved over `popular_k` neighbours instead of
    k: they are the most often recommended, and co-occur with the most items. `rank`: which
    items are neighbours (`rank_weights`; "count" here, as the benchmarks' earlier figures
    were solved, while the models' `neighbour_rank` setting defaults to "cosine")."""
    from vaecf.models import gather

    gram = gather.gram(x) if gram is None else gram
    gram.sort_indices()
    n = gram.shape[0]
    diag = gram.diagonal().astype(np.float64)
    lam = l2 + (dropout / (1.0 - dropout)) * diag if dropout else np.full(n, float(l2))
    weight = rank_weights(rank, diag)
    wide = popular_tier(diag, popular_share) if popular_share > 0 else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(n), wide)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    rows_out, cols_out, vals_out = [], [], []
    blocks = gather.Blocks(gram, np_dtype, HUBS)
    for group, kk in ((rest, k), (wide, popular_k)):
        kk = max(1, min(kk, n - 1))
        if not len(group):
            continue
        nbrs, strongest = neighbours_of(gram, kk, group, weight)  # (len(group), kk), padded n
        # items that share their most co-occurring item share much of their neighbourhoods
        # (by either rank; ordered by cosine's first neighbour instead, a 15,000-item solve
        # took 2.2x as long): in that order a block's span covers more items, and fewer of
        # G's rows are gathered
        order = np.lexsort((group, strongest))
        max_items = max(1, BLOCK_SYSTEM_BYTES // (8 * kk * kk))
        for rows, span in gather.spans(group, nbrs, order, BLOCK_UNION, max_items, n):
            items, block_nbrs = group[rows], nbrs[rows]
            b = _solve_block(blocks, span, items, block_nbrs, lam, l2, np_dtype, device, dtype)
            real = block_nbrs < n
            rows_out.append(block_nbrs[real])
            cols_out.append(np.broadcast_to(items[:, None], real.shape)[real])
            vals_out.append(b[real])
    rows, cols = np.concatenate(rows_out), np.concatenate(cols_out)
    b = sp.csr_matrix((np.concatenate(vals_out).astype(np.float32), (rows, cols)), shape=(n, n))
    b.sort_indices()
    return (
        torch.from_numpy(b.indptr.astype(np.int64)).to(device),
        torch.from_numpy(b.indices.astype(np.int64)).to(device),
        torch.from_numpy(b.data).to(device),
    )


def _solve_block(blocks, span, items, nbrs, lam, l2, np_dtype, device, dtype) -> np.ndarray:
    """(J, kk) each item's weights over its kk neighbours (`nbrs`, padded with n): the
    systems (G[N_j, N_j] + diag(lambda)) b = G[N_j, j], from G's rows and columns `span` (the
    union of the block's neighbourhoods) gathered once."""
    from vaecf.models import gather

    n = blocks.gram.shape[0]
    pos = np.full(n + 1, len(span), dtype=np.int64)  # padding -> a zero row/column
    pos[span] = np.arange(len(span))
    full = blocks.dense(span)  # G[span, span], then the padding's zero row/column
    lam_span = np.append(lam[span], 1.0).astype(np_dtype)  # padding: 1 * b = 0
    refused = f"a neighbourhood system with lambda {l2} is not positive definite"
    if device.type == "cpu" and nbrs.shape[1] <= IN_CACHE:
        b = gather.solve_systems(full, pos[nbrs], lam_span, pos[items])
        if b is None:
            raise RunError(refused)
        return b
    a, rhs = gather.systems(full, pos[nbrs], lam_span, pos[items])  # (J, kk, kk), (J, kk)
    at = torch.from_numpy(a).to(device=device, dtype=dtype)
    try:
        b = spd_solve_batch(at, torch.from_numpy(rhs).to(at))
    except NotPositiveDefinite:
        raise RunError(refused) from None
    return b.cpu().numpy()


def sparse_b_rows(
    indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, batch: SparseBatch, n: int
) -> torch.Tensor:
    """(B, n) X_batch B for a B held as CSR rows (history item -> weights on other items): a
    sparse x sparse product (scipy's on the CPU, torch's CSR product elsewhere), made dense."""
    offsets = torch.cat([batch.offsets, batch.offsets.new_tensor([batch.indices.numel()])])
    if values.device.type == "cpu":
        x = sp.csr_matrix(
            (batch.values.float().numpy(), batch.indices.numpy(), offsets.numpy()),
            shape=(batch.batch_size, n),
        )
        b = sp.csr_matrix((values.float().numpy(), indices.numpy(), indptr.numpy()), (n, n))
        return torch.from_numpy((x @ b).toarray()).to(values.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "sparse CSR support is in beta"
        x = torch.sparse_csr_tensor(
            offsets, batch.indices, batch.values.to(values.dtype), size=(batch.batch_size, n)
        )
        b = torch.sparse_csr_tensor(indptr, indices, values, size=(n, n))
        return (x @ b).to_dense()
