"""The output layer and the multinomial NLL as one autograd function.

Where the FLOPs and bytes of Mult-VAE go: the output layer (B x d) @ (d x n_items) and its two
backward products are ~95% of the FLOPs, and the (B, n_items) logits are the only large
activation. Plain autograd walks that array many times (logsumexp, its backward, the gather's
backward into a fresh zero array, the sum of both) and allocates several copies of it per step.
Here the logits are computed once; in cache-sized row chunks their log-sum-exp is taken and the
buffer overwritten with the softmax (one exp per logit), and backward turns that same buffer into
the logits' gradient n_u * softmax - x, so one (B, n_items) array serves the whole step.

Under autocast (bf16/fp16) the products run in the autocast dtype and every reduction and the
softmax run in float32 (float64 inputs stay float64). On a CPU the bias is added in those row
chunks, in float32, not by the product (`addmm` copies the bias into all B rows first: a
(B, n_items) pass, ~1 ms a step at batch 500 x 20,108 items in bf16), and backward takes the
weight gradient and the bias's column sums in pieces (`weight_grad`, `column_sums`).

On a GPU the logits' rows are padded to a multiple of 64 columns (weight rows of zeros, bias
-inf, so the padding's softmax is exactly 0): with 20,108 items a bf16 row is 40,216 bytes, not
a multiple of 16, and cuBLAS then cannot use Hopper's TMA kernels for any of the three products.
Where Triton runs (PyTorch's CUDA builds), the softmax's passes are `softmax_kernels`' two: the
logits are kept as computed and their log-sum-exp read off in one pass; backward overwrites them
with n_u * softmax in one read and write, the bias's column sums taken on the way (a bf16 step at
batch 24,576 on an H200: 9.8 -> 7.8 ms; `USE_KERNELS` off keeps PyTorch's passes).
"""

from __future__ import annotations

import torch

from vaecf.models import softmax_kernels

_CHUNK_BYTES = 1 << 20  # rows per chunk so that one chunk's float32 copy fits in L2
_SUM_BYTES = 4 << 20  # rows per chunk of the bias gradient's float32 column sums (CPU)
_WEIGHT_GRAD_ROWS = 4096  # item rows per piece of the weight gradient's product (CPU, bf16)
GPU_MULTIPLE = 64  # the logits' row length on a GPU is a multiple of this (see above)
USE_KERNELS = True  # the softmax's passes as softmax_kernels' Triton kernels where they run


def padded(t: torch.Tensor, dtype: torch.dtype, rows: int, fill: float = 0.0) -> torch.Tensor:
    """`t` in `dtype` with its first dimension extended to `rows` by `fill` (`t` itself, cast,
    when it already has `rows`): one pass over `t` (the cast into the new array's first rows),
    the fill written to the extra rows alone."""
    n = t.shape[0]
    if n == rows:
        return t.to(dtype)
    out = t.new_empty((rows, *t.shape[1:]), dtype=dtype)
    out[n:].fill_(fill)  # one kernel (a slice assigned a number launches two)
    out[:n] = t
    return out


def logits_width(n_items: int, device: torch.device, multiple: int | None = None) -> int:
    """The row length of the fused layer's logits: n_items rounded up to `multiple` (default:
    GPU_MULTIPLE on a GPU, 1 elsewhere)."""
    if multiple is None:
        multiple = 1 if device.type == "cpu" else GPU_MULTIPLE
    return -(-n_items // multiple) * multiple


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
    def forward(ctx, h, weight, bias, indices, row_ids, values, n_u, offset=None, width=None):
        dtype = _compute_dtype(h)
        acc = _acc(dtype)
        n = weight.shape[0]
        width = n if width is None else width
        kernels = USE_KERNELS and acc == torch.float32 and softmax_kernels.available(h.device)
        chunked = h.device.type == "cpu" and not kernels  # the CPU's softmax in row chunks
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dtype), padded(weight, dtype, width)
            bc = padded(bias, acc if chunked else dtype, width, fill=float("-inf"))
            if chunked:  # the bias is added in `acc` in the softmax's chunks (no (B, width) pass)
                logits = hc @ wc.t()
            else:
                logits = torch.addmm(bc, hc, wc.t())  # (B, width): softmax 0 beyond n_items
            if offset is not None:  # logits of another path, added before the softmax
                logits[:, :n].add_(offset.to(dtype))
            flat = row_ids * width + indices  # each non-zero's place in the flattened logits
            picked = logits.view(-1)[flat].to(acc)  # before the overwrite
            if kernels:  # the logits kept as they are: backward makes the softmax from them
                lse = softmax_kernels.row_logsumexp(logits)
            elif chunked:
                picked += bc[indices]
                lse = softmax_chunked(logits, acc, bc)
            else:
                logits, lse = softmax_whole(logits, acc)
            # sum_u n_u lse_u - sum_ui x_ui logit_ui: two dot products, no per-row sums
            nll = torch.dot(n_u.to(acc), lse) - torch.dot(picked, values.to(acc))
        ctx.save_for_backward(hc, wc, logits, n_u, indices, row_ids, values, flat, lse)
        ctx.kernels = kernels
        ctx.dtypes = (h.dtype, weight.dtype, bias.dtype)
        ctx.n_items = n
        ctx.offset_dtype = offset.dtype if offset is not None else None
        return nll

    @staticmethod
    def backward(ctx, grad):
        hc, wc, probs, n_u, indices, row_ids, values, flat, lse = ctx.saved_tensors
        acc = _acc(probs.dtype)
        scale = grad.to(acc)
        sums = None  # the column sums of n_u * softmax, where the kernel took them
        with torch.autocast(probs.device.type, enabled=False):
            coef = n_u.to(acc) * scale
            if ctx.kernels:  # probs holds the logits still
                g, sums = probs, softmax_kernels.scaled_softmax_(probs, lse, coef)
            else:
                g = probs.mul_(coef[:, None].to(probs.dtype))  # n_u * softmax
            picked = -scale * values.to(acc)
            if g.device.type == "cpu" and not ctx.kernels:
                g.index_put_((row_ids, indices), picked.to(g.dtype), accumulate=True)
            else:  # atomics on distinct places: no sort (index_put_'s accumulate sorts on a GPU)
                g.view(-1).index_add_(0, flat, picked.to(g.dtype))
            h_dt, w_dt, b_dt = ctx.dtypes  # g is now d loss / d logits (B, width)
            n = ctx.n_items  # the padding's rows of wc and columns of g are 0
            grad_h = (g @ wc).to(h_dt) if ctx.needs_input_grad[0] else None
            grad_w = weight_grad(g, hc, n, w_dt) if ctx.needs_input_grad[1] else None
            grad_b = None
            if ctx.needs_input_grad[2] and sums is not None:
                grad_b = sums.index_add_(0, indices, picked)[:n].to(b_dt)
            elif ctx.needs_input_grad[2]:
                grad_b = column_sums(g, acc)[:n].to(b_dt)
            grad_o = (
                g[:, :n].to(ctx.offset_dtype) if ctx.needs_input_grad[7] else None
            )  # d loss / d offset = d / d logits
        return grad_h, grad_w, grad_b, None, None, None, None, grad_o, None


def weight_grad(g: torch.Tensor, hc: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, d) the output layer's weight gradient g[:, :n]^T @ hc, in `dtype`. On a CPU with a
    narrower g it is computed and widened _WEIGHT_GRAD_ROWS item rows at a time: the same
    sums, and oneDNN's bf16 product runs faster on those pieces than on the whole (20,108 x 500
    x 600 on Zen 5: 15.3 ms in chunks of 4,096 rows, product and float32 copy, against 17.6 +
    1.9 ms)."""
    if g.dtype == dtype or g.device.type != "cpu":
        return (g.t() @ hc)[:n].to(dtype)
    out = torch.empty(n, hc.shape[1], dtype=dtype)
    for lo in range(0, n, _WEIGHT_GRAD_ROWS):
        out[lo : lo + _WEIGHT_GRAD_ROWS] = g[:, lo : min(lo + _WEIGHT_GRAD_ROWS, n)].t() @ hc
    return out


def column_sums(g: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """(width,) the sums of g's columns in `acc`. On a CPU a narrower g is summed a few MiB of
    rows at a time: `sum(dtype=float32)` of the whole array first copies all of it to float32
    (in the step, where the gradient is warm from the products, -1.8 ms of the backward at 500 x
    20,108 bf16 on Zen 5; benchmarks/README.md); a GPU's reduction converts as it reads."""
    if g.dtype == acc or g.device.type != "cpu":
        return g.sum(0, dtype=acc)
    rows = max(1, _SUM_BYTES // (4 * g.shape[1]))
    out = g[:rows].sum(0, dtype=acc)
    for lo in range(rows, g.shape[0], rows):
        out += g[lo : lo + rows].sum(0, dtype=acc)
    return out


def softmax_chunked(
    logits: torch.Tensor, acc: torch.dtype, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) each row's log-sum-exp, the buffer overwritten with softmax(logits + bias), in one
    sweep of cache-sized row chunks (a chunk's `acc` copy fits in L2). Each chunk's softmax is
    PyTorch's fused kernel (one exp per logit, vectorised), and the log-sum-exp is read off
    its largest probability, p_max = exp(max - lse), computed in `acc`: exact to its rounding.
    At batch 500 x 20,108 in bf16 that is ~2 ms a step less than exp, sum and divide as
    separate passes (Zen 5, benchmarks/README.md)."""
    b, n = logits.shape
    chunk = max(1, _CHUNK_BYTES // (4 * n))
    lse = torch.empty(b, dtype=acc, device=logits.device)
    for lo in range(0, b, chunk):
        rows = logits[lo : lo + chunk]
        t = rows.to(acc)  # the rows themselves where they are in `acc` already
        if bias is not None:
            t.add_(bias)
        p = torch.softmax(t, dim=1)
        lse[lo : lo + chunk] = t.amax(dim=1) - p.amax(dim=1).log()
        rows.copy_(p)
    return lse


def softmax_whole(logits: torch.Tensor, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(logits) in the logits' dtype, (B,) log-sum-exp in `acc`) in three passes, none
    materialising the logits in float32 (softmax accumulates in float32 internally). The
    log-sum-exp comes from the largest probability, p_max = exp(max - lse): exact in float32,
    within 2^-8 (bf16) of the row's log-sum-exp otherwise, which only the reported loss uses."""
    top = logits.amax(dim=1).to(acc)
    probs = torch.softmax(logits, dim=1)
    return probs, top - probs.amax(dim=1).to(acc).log()


def linear_multinomial_nll(
    h, weight, bias, batch, offset=None, multiple=None, values=None
) -> torch.Tensor:
    """Summed multinomial NLL of logits h @ weight.T + bias (+ `offset`, (B, n_items)) against
    the batch's non-zeros (`values` in place of theirs: the log-sum-exp still weighs each row
    by its own count); the logits' rows padded to `multiple` columns (`logits_width`)."""
    width = logits_width(weight.shape[0], h.device, multiple)
    v = batch.values if values is None else values
    return LinearMultinomialNLL.apply(
        h, weight, bias, batch.indices, batch.row_ids, v, batch.row_sums(), offset, width
    )
