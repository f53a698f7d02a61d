"""The output layer and the multinomial NLL as one autograd function.

Where the FLOPs and bytes of Mult-VAE go: the output layer (B x d) @ (d x n_items) and its two
backward products are ~95% of the FLOPs, and the (B, n_items) logits are the only large
activation. Plain autograd walks that array many times (logsumexp, its backward, the gather's
backward into a fresh zero array, the sum of both) and allocates several copies of it per step.
Here the logits are computed once, their log-sum-exp read in cache-sized row chunks, and in
backward the same buffer is overwritten with the logits' gradient
n_u * softmax - x, so one (B, n_items) array serves the whole step.

Under autocast (bf16/fp16) the products run in the autocast dtype and every reduction and the
softmax run in float32 (float64 inputs stay float64).
"""

from __future__ import annotations

import torch

_CHUNK_BYTES = 1 << 20  # rows per chunk so that one chunk's float32 copy fits in L2


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    kind = t.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return t.dtype


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class LinearMultinomialNLL(torch.autograd.Function):
    """sum_u [ n_u * logsumexp(h_u W^T + b) - sum_i x_ui (h_u W^T + b)_i ]; backward once."""

    @staticmethod
    def forward(ctx, h, weight, bias, indices, row_ids, values, n_u):
        dtype = _compute_dtype(h)
        acc = _acc(dtype)
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dtype), weight.to(dtype)
            logits = torch.addmm(bias.to(dtype), hc, wc.t())  # (B, n_items)
            b, n = logits.shape
            chunk = b if h.device.type != "cpu" else max(1, _CHUNK_BYTES // (4 * n))
            lse = torch.empty(b, dtype=acc, device=h.device)
            for lo in range(0, b, chunk):
                lse[lo : lo + chunk] = torch.logsumexp(logits[lo : lo + chunk].to(acc), dim=1)
            picked = logits[row_ids, indices].to(acc) * values.to(acc)
            s = torch.zeros(b, dtype=acc, device=h.device).index_add_(0, row_ids, picked)
            nll = (n_u.to(acc) * lse - s).sum()
        ctx.save_for_backward(hc, wc, logits, lse, n_u, indices, row_ids, values)
        ctx.chunk, ctx.dtypes = chunk, (h.dtype, weight.dtype, bias.dtype)
        return nll

    @staticmethod
    def backward(ctx, grad):
        hc, wc, logits, lse, n_u, indices, row_ids, values = ctx.saved_tensors
        b = logits.shape[0]
        acc = lse.dtype
        scale = grad.to(acc)
        coef = (n_u.to(acc) * scale)[:, None]  # (B, 1)
        same = logits.dtype == acc
        with torch.autocast(logits.device.type, enabled=False):
            for lo in range(0, b, ctx.chunk):
                rows = logits[lo : lo + ctx.chunk]
                t = rows if same else rows.to(acc)
                t.sub_(lse[lo : lo + ctx.chunk, None]).exp_().mul_(coef[lo : lo + ctx.chunk])
                if not same:
                    rows.copy_(t)
            g = logits  # now d loss / d logits (B, n_items)
            g.index_put_((row_ids, indices), (-scale * values.to(acc)).to(g.dtype), accumulate=True)
            h_dt, w_dt, b_dt = ctx.dtypes
            grad_h = (g @ wc).to(h_dt) if ctx.needs_input_grad[0] else None
            grad_w = (g.t() @ hc).to(w_dt) if ctx.needs_input_grad[1] else None
            grad_b = g.sum(0, dtype=acc).to(b_dt) if ctx.needs_input_grad[2] else None
        return grad_h, grad_w, grad_b, None, None, None, None


def linear_multinomial_nll(h, weight, bias, batch) -> torch.Tensor:
    """Summed multinomial NLL of logits h @ weight.T + bias against the batch's non-zeros."""
    return LinearMultinomialNLL.apply(
        h, weight, bias, batch.indices, batch.row_ids, batch.values, batch.row_sums()
    )
