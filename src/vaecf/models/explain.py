"""Why an item was recommended: which of the history's items led to it, each with a weight.

- Models whose score is a sum over the history (EASE, EDLAE: score_i = sum_j x_j B_ji, the
  popularity penalty in B's columns) give the exact decomposition (`Model.contributions`):
  history item j's weight is its term x_j B_ji, and the weights over the whole history sum to
  the item's score.
- Every other model (Mult-VAE, Mult-DAE, RecVAE, inf-AE, blends) is asked what it would answer
  without each history item: j's weight is how much the item's score falls when j is removed
  (for the multinomial models the score is the item's probability, so the weight is the
  probability it loses; the weights need not sum to the score). Every leave-one-out history of
  every explained answer is scored in one batched pass (in chunks of at most SCORE_BUDGET bytes
  of scores), never one call per item.

The work is bounded: history items x recommended items, summed over the histories of a request,
at most MAX_EXPLAIN_WORK (`check_work`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from vaecf.data.matrix import SparseBatch
from vaecf.errors import ConfigError

EXPLAIN_TOP = 3  # history items named per recommended item by default
MAX_EXPLAIN_WORK = 100_000  # history items x recommended items per request, all histories
SCORE_BUDGET = 2**28  # bytes of float32 scores per leave-one-out chunk


def check_work(histories: Sequence[Sequence[int]], k: int) -> None:
    """ConfigError (a 422 on the server) where explaining `histories`' top `k` passes
    MAX_EXPLAIN_WORK."""
    work = sum(len(h) for h in histories) * k
    if work > MAX_EXPLAIN_WORK:
        raise ConfigError(
            f"explaining {sum(len(h) for h in histories):,} history items x k={k} is "
            f"{work:,} item pairs, more than the {MAX_EXPLAIN_WORK:,} one request may explain: "
            "ask for a smaller k, shorter histories or fewer of them, or no explanation"
        )


def _without_each(histories: Sequence[torch.Tensor], device) -> SparseBatch:
    """A batch holding, for every history, the history itself and then the history without
    each of its items in turn (len(h) + 1 rows per history)."""
    rows = []
    for h in histories:
        rows.append(h)
        n = len(h)
        if n:
            keep = ~torch.eye(n, dtype=torch.bool)
            rows.extend(h.expand(n, n)[keep].view(n, n - 1))
    return SparseBatch.of_rows(rows, device)


def _chunks(batch: SparseBatch, rows_per_chunk: int):
    """`batch` split into batches of at most `rows_per_chunk` rows."""
    starts = list(range(0, batch.batch_size, rows_per_chunk))
    ends = torch.cat([batch.offsets, batch.offsets.new_tensor([batch.indices.numel()])])
    for a in starts:
        b = min(a + rows_per_chunk, batch.batch_size)
        lo, hi = int(ends[a]), int(ends[b])
        yield SparseBatch(
            indices=batch.indices[lo:hi],
            offsets=batch.offsets[a:b] - lo,
            values=batch.values[lo:hi],
            row_ids=batch.row_ids[lo:hi] - a,
            batch_size=b - a,
        )


@torch.no_grad()
def leave_one_out(
    score_fn: Callable[[SparseBatch], torch.Tensor],
    histories: Sequence[torch.Tensor],
    items: Sequence[torch.Tensor],
    n_items: int,
    multinomial: bool,
    device,
) -> list[torch.Tensor]:
    """For each history h (item indices) and its recommended `items`: (len(h), len(items))
    float32, the fall of each item's score (probability, for a multinomial model) when each
    history item is removed. One batched pass over every leave-one-out history."""
    batch = _without_each(histories, device)
    per_chunk = max(1, SCORE_BUDGET // (4 * n_items))
    parts = []
    for chunk in _chunks(batch, per_chunk):
        s = score_fn(chunk).float()
        parts.append(torch.softmax(s, dim=1) if multinomial else s)
    scores = torch.cat(parts) if parts else torch.zeros(0, n_items)
    out, row = [], 0
    for h, its in zip(histories, items):
        n, its = len(h), its.to(scores.device)
        full, without = scores[row, its], scores[row + 1 : row + 1 + n][:, its]
        out.append((full[None, :] - without).float().cpu())
        row += n + 1
    return out


def weights(
    model, score_fn, histories: Sequence[torch.Tensor], items: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """Each history's (len(h), len(items)) weights: the exact decomposition where the model
    has one, else leave-one-out."""
    dev = model.device
    exact = [model.contributions(h.to(dev), its.to(dev)) for h, its in zip(histories, items)]
    if all(e is not None for e in exact):
        return [e.cpu() for e in exact]
    return leave_one_out(score_fn, histories, items, model.n_items, model.multinomial, model.device)


def strongest(w: torch.Tensor, top: int | None) -> list[list[tuple[int, float]]]:
    """For each recommended item (a column of `w`), [(history position, weight)] strongest
    first: the `top` largest weights (all of them for None)."""
    order = torch.argsort(w, dim=0, descending=True, stable=True)
    if top is not None:
        order = order[:top]
    return [[(int(j), float(w[j, c])) for j in order[:, c]] for c in range(w.shape[1])]
