"""The linear item-item family's mathematics, shared by EASE/EDLAE (vaecf.models.ease), the
RecVAE+EDLAE hybrid and the benchmarks: B from a Gram matrix in closed form, the scores X B,
metrics of a B on a split (with the popularity penalty), the folds of the training users for
`--selection cv`, and the memory a dense solve holds.

With G = X^T X and a dropout rate p (EDLAE's emphasized denoising; p = 0 is EASE exactly):
    P = (G + lambda I + p/(1-p) diagMat(diag G))^-1,   B = I - P diagMat(1 / diag P),
and scores = X B (diag B = 0, so an item never predicts itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from vaecf import memory
from vaecf.data.matrix import CSR, SparseBatch
from vaecf.errors import RunError
from vaecf.memory import items_cut
from vaecf.models.linalg import NotPositiveDefinite, spd_inverse


def sparse_rows(table: torch.Tensor, batch: SparseBatch) -> torch.Tensor:
    """(B, d) sum over each history of value x the item's row of `table`."""
    return F.embedding_bag(
        batch.indices,
        table,
        batch.offsets,
        mode="sum",
        per_sample_weights=batch.values.to(table.dtype),
    )


def linear_bytes(n_items: int, dtype: torch.dtype, search: bool) -> int:
    """Peak bytes of a fit's n_items^2 arrays: the Gram and the array solved in place (in the
    solve's dtype), a float32 copy of B when solving in float64, and the best B kept while a
    search goes on."""
    elem = torch.empty((), dtype=dtype).element_size()
    return n_items * n_items * (2 * elem + (4 if elem != 4 else 0) + (4 if search else 0))


def check_memory(
    n_items: int,
    dtype: torch.dtype,
    device: torch.device,
    search: bool,
    item_users: np.ndarray | None = None,
) -> int:
    """Refuse, before anything large is allocated, with the figures and only the advice that
    would make the fit go through. `item_users`: each item's number of users (rows)."""
    need = linear_bytes(n_items, dtype, search)
    free = memory.free_memory(device)
    if need <= free.bytes:
        return need
    advice = []
    fits = math.isqrt(free.bytes * n_items * n_items // need)  # items whose arrays would fit
    kept = 0
    if item_users is not None and 0 < fits < n_items:
        cut, kept = items_cut(item_users, fits)
    if kept:
        advice.append(
            f"keep the {kept:,} items with at least {cut} users (prepare again with "
            f"--min-item-users {cut}; counted there over every user, a few more may stay)"
        )
    else:
        advice.append("drop rare items when preparing (--min-item-users)")
    if dtype != torch.float32:
        advice.append("solve in float32 (--solve-dtype float32)")
    if search:
        one = linear_bytes(n_items, dtype, False)
        if one <= free.bytes:
            advice.append(f"give --l2 (one solve needs {memory.gib(one)}, no search)")
    advice.append(
        "use a device with more memory, or an autoencoder (its memory grows with "
        "the items, not their square)"
    )
    parts = f" for its {n_items:,} x {n_items:,} arrays"
    raise RunError(memory.refusal(f"EASE on {n_items:,} items", need, free, device, advice, parts))


def linear_weights(
    gram: torch.Tensor,
    l2: float,
    dropout: float = 0.0,
    emphasis: str = "full",
    delta: sp.spmatrix | None = None,
) -> torch.Tensor:
    """B for one (lambda, p) from the Gram matrix X^T X (not modified; `delta`, a sparse
    correction, added to its copy first): EASE at p = 0 with full emphasis (EDLAE); with none,
    DLAE's B = I - P Lambda (its diagonal then set to 0: a history's own items are never
    ranked, so it changes no recommendation)."""
    a = gram.clone()
    if delta is not None and delta.nnz:
        c = delta.tocoo()
        at = [torch.from_numpy(v.astype(np.int64)).to(a.device) for v in (c.row, c.col)]
        a.index_put_(tuple(at), torch.from_numpy(c.data).to(a), accumulate=True)
    d = a.diagonal()
    base = d.clone() if emphasis == "none" else None
    if dropout:
        d.div_(1.0 - dropout)  # G_ii + p/(1-p) G_ii
    d.add_(l2)
    lam = d - base if base is not None else None  # Lambda: l2 + p/(1-p) G_ii
    try:
        p = spd_inverse(a)  # (n_items, n_items), in a's memory where it can
    except NotPositiveDefinite:
        raise RunError(f"X^T X + {l2} I is not positive definite here; use a larger --l2") from None
    if lam is not None:
        b = p.mul_(-lam)  # -P Lambda, column-wise
    else:
        b = p.div_(-p.diagonal().clone())  # -P / diag(P), column-wise
    b.diagonal().zero_()  # with full emphasis, I - P diag(1/diag P) cancels exactly
    return b


def metrics_of(weight: torch.Tensor, fold_in: CSR, target: CSR) -> dict:
    from vaecf.evaluate import evaluate_scores

    return evaluate_scores(lambda batch: sparse_rows(weight, batch), fold_in, target)


def penalty(diag: torch.Tensor, beta: float) -> torch.Tensor:
    """The popularity penalty's column scales: count_j^-beta (1 for beta 0)."""
    return diag.double().clamp(min=1.0).pow(-beta).float()


def beta_metrics(
    b: torch.Tensor | Callable[[SparseBatch], torch.Tensor],
    diag: torch.Tensor,
    betas: list[float],
    fold_in: CSR,
    target: CSR,
    metrics: tuple[str, ...] | None = None,
) -> list[dict]:
    """Metrics of the unpenalised B (a dense table, or a function of a batch giving its rows of
    X B) under each penalty beta: X B's columns rescaled, which is X (B's columns rescaled),
    without a copy of B."""
    from vaecf.evaluate import DEFAULT_METRICS, evaluate_scaled

    rows = b if callable(b) else (lambda t: sparse_rows(b, t))
    scales = [penalty(diag, beta).to(target.device) for beta in betas]
    return evaluate_scaled(rows, scales, fold_in, target, metrics or DEFAULT_METRICS)


def pooled(parts: list[dict]) -> dict:
    """Metrics over the union of several user sets (means weighted by their users; a set
    without users counts for nothing)."""
    keys = [k for k in parts[0] if k not in ("n_users", "n_skipped")]
    parts = [m for m in parts if m["n_users"]]
    n = sum(m["n_users"] for m in parts)
    out = {k: sum(m[k] * m["n_users"] for m in parts) / n if n else math.nan for k in keys}
    return {**out, "n_users": n}


def restrict(m: sp.csr_matrix, cols: np.ndarray | None) -> sp.csr_matrix:
    return m if cols is None else m[cols][:, cols]


def csr_on(m: sp.spmatrix, cols: np.ndarray | None, device: torch.device) -> CSR:
    m = m.tocsr()
    return CSR.from_scipy(m if cols is None else m[:, cols], device)


def cv_folds(
    train: sp.csr_matrix, k: int, dtype, seed: int = 0
) -> list[tuple[sp.csr_matrix, sp.csr_matrix, sp.csr_matrix]]:
    """K folds of the training users with 5 or more items, as held-out users: each fold's
    (Gram correction, fold-in, target), the correction taking its users' rows out of X^T X
    and putting their fold-in rows back (their 80 percent, drawn as the held-out users' are)."""
    from vaecf.data.splits import fold_in_mask

    x = train.tocsr().astype(dtype)
    x.sort_indices()
    users = np.flatnonzero(np.diff(x.indptr) >= 5)
    fold_of = np.random.default_rng(seed).permutation(len(users)) % k
    out = []
    for f in range(min(k, len(users))):  # no empty fold where fewer users than folds
        xf = x[users[fold_of == f]]
        held = fold_in_mask(np.diff(xf.indptr), seed + f)
        f_te = xf.copy()
        f_te.data = np.where(held, f_te.data, 0).astype(dtype)
        f_te.eliminate_zeros()
        f_in = (xf - f_te).tocsr()
        f_in.eliminate_zeros()
        delta = (f_in.T @ f_in - xf.T @ xf).tocsr()
        delta.eliminate_zeros()
        out.append((delta, f_in, f_te))
    return out
