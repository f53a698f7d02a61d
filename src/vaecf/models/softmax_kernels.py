"""The fused output layer's two passes over its (B, width) logits as Triton kernels (GPU).

What PyTorch's kernels take for the multinomial NLL's softmax at batch 24,576 x 20,160 bf16 on
an H200 is ~4 ms a step beside the layer's three products (~2.6 ms): a row max, the softmax
(read, write), the largest probability, its scaling by n_u (read, write) and the bias's column
sums each walk the ~1 GB array. Here two kernels walk it twice in all:

- `row_logsumexp`: one read; each row's log-sum-exp in float32 by the running max and sum
  (the logits are left as they are, for backward);
- `scaled_softmax_`: one read and one write; the buffer overwritten with coef_u * softmax_u
  (coef = n_u times the upstream gradient) in its own dtype, and that product's column sums in
  float32, taken tile by tile from the float32 values before they are rounded (one partial row
  per block of rows, summed after: the same order every time).

Triton ships with PyTorch's CUDA builds; where it cannot be imported (CPU builds), or its first
small trial on a GPU fails (no C compiler for its launcher, a GPU it does not build for),
`available()` is False and the fused layer keeps PyTorch's kernels. `TRITON_INTERPRET=1` runs
these kernels on a CPU, as the tests do where Triton is installed.
"""

from __future__ import annotations

import warnings

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of PyTorch ships without Triton
    triton = None

# the shapes each kernel is timed at on its first call for a width (Triton's autotuner), the
# fastest kept: `row_logsumexp`'s columns read at once and warps; `scaled_softmax_`'s tile
# columns and warps, its rows fixed (each block of rows writes one row of partial sums, so
# every shape fills the same rows: what a trial leaves is overwritten by the kept shape)
_LSE_CONFIGS = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]
_TILE_ROWS = 32
_TILE_CONFIGS = [(256, 4), (256, 8), (512, 8), (1024, 8), (1024, 16), (2048, 16)]


def _interpreted() -> bool:
    from triton import knobs  # noqa: PLC0415 (only once Triton is known to be there)

    return bool(knobs.runtime.interpret)


_RUNS: dict[int, bool] = {}  # CUDA device index -> whether the kernels ran there (_runs_on)


def available(device: torch.device) -> bool:
    """Whether these kernels run for tensors on `device`: Triton importable, and a GPU where a
    first small log-sum-exp compiled, ran and matched PyTorch's (or the interpreter,
    TRITON_INTERPRET=1, on a CPU)."""
    if triton is None:
        return False
    if device.type != "cuda":
        return _interpreted()
    index = device.index
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    if index not in _RUNS:
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if capturing:  # no trial inside a CUDA graph's capture
            return False
        _RUNS[index] = _runs_on(index)
    return _RUNS[index]


def _runs_on(index: int) -> bool:
    """Triton builds a launcher for each kernel with the machine's C compiler when it first
    runs: where there is none, or the GPU is one Triton does not build for, PyTorch's kernels
    stay (with a warning) rather than the step failing."""
    try:
        # fixed values: the trial draws nothing from the training's random stream
        x = torch.linspace(-4.0, 4.0, 300, device=f"cuda:{index}").view(3, 100).sin()
        out = torch.empty(3, device=x.device)
        block, warps = _LSE_CONFIGS[0]
        _lse_kernel.fn[(3,)](out_ptr=out, x_ptr=x, stride=x.stride(0), N_COLS=100, BLOCK=block,
                             num_warps=warps)  # fmt: skip
        if torch.allclose(out, torch.logsumexp(x, 1), atol=1e-4):
            return True
        problem = "its log-sum-exp did not match PyTorch's"
    except Exception as e:  # noqa: BLE001 - any failure to build or run means: not here
        problem = f"{type(e).__name__}: {e}"
    warnings.warn(f"the fused loss's Triton kernels do not run on cuda:{index} ({problem}); "
                  "PyTorch's kernels are used", stacklevel=2)  # fmt: skip
    return False


def _launch(kernel, grid, *args, first: dict, **kw) -> None:
    """`kernel` autotuned on a GPU; in the interpreter (nothing to time) at its `first` shape."""
    if _interpreted():
        kernel.fn[grid](*args, **kw, **first)
    else:
        kernel[grid](*args, **kw)


if triton is not None:

    @triton.autotune(
        [triton.Config({"BLOCK": b}, num_warps=w) for b, w in _LSE_CONFIGS], key=["N_COLS"]
    )
    @triton.jit
    def _lse_kernel(x_ptr, out_ptr, stride, N_COLS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + row * stride
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, N_COLS, BLOCK):  # the width a constant: one build a model
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < N_COLS, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            live = m_new > float("-inf")  # a lane that has seen only -inf adds nothing yet
            s = tl.where(live, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
            m = m_new
        top = tl.max(m, axis=0)
        total = tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - top), 0.0), axis=0)
        tl.store(out_ptr + row, top + tl.log(total))

    @triton.autotune(
        [triton.Config({"BN": n}, num_warps=w) for n, w in _TILE_CONFIGS],
        key=["n_cols"],
        restore_value=["x_ptr"],  # it overwrites its input: each timed shape starts from it
    )
    @triton.jit
    def _scaled_softmax_kernel(
        x_ptr, lse_ptr, coef_ptr, part_ptr, n_rows, n_cols, stride, BM: tl.constexpr,
        BN: tl.constexpr,
    ):  # fmt: skip
        pm = tl.program_id(0)
        pn = tl.program_id(1)
        rows = pm * BM + tl.arange(0, BM)
        cols = pn * BN + tl.arange(0, BN)
        rmask = rows < n_rows
        cmask = cols < n_cols
        mask = rmask[:, None] & cmask[None, :]
        ptrs = x_ptr + rows[:, None].to(tl.int64) * stride + cols[None, :]
        x = tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)
        lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
        coef = tl.load(coef_ptr + rows, mask=rmask, other=0.0)
        g = tl.where(mask, tl.exp(x - lse[:, None]) * coef[:, None], 0.0)
        tl.store(ptrs, g.to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(part_ptr + pm.to(tl.int64) * n_cols + cols, tl.sum(g, axis=0), mask=cmask)


def row_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """(B,) float32 log-sum-exp of each row of a (B, width) array whose rows are contiguous."""
    b, n = logits.shape
    out = torch.empty(b, dtype=torch.float32, device=logits.device)
    if b:
        block, warps = _LSE_CONFIGS[0]
        first = dict(BLOCK=block, num_warps=warps)
        _launch(_lse_kernel, (b,), logits, out, logits.stride(0), N_COLS=n, first=first)
    return out


def scaled_softmax_(logits: torch.Tensor, lse: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Overwrite `logits` with coef[:, None] * exp(logits - lse[:, None]) (its dtype) and return
    that product's (width,) float32 column sums, taken before the rounding."""
    b, n = logits.shape
    blocks = triton.cdiv(b, _TILE_ROWS)
    parts = torch.empty(blocks, n, dtype=torch.float32, device=logits.device)

    def grid(meta):
        return blocks, triton.cdiv(n, meta["BN"])

    cols, warps = _TILE_CONFIGS[0]
    first = dict(BN=cols, num_warps=warps)
    args = (logits, lse, coef.float().contiguous(), parts, b, n, logits.stride(0), _TILE_ROWS)
    _launch(_scaled_softmax_kernel, grid, *args, first=first)
    return parts.sum(0)


def chosen() -> dict:
    """The shapes the autotuner kept, by kernel and width ({} before the first call)."""
    if triton is None:
        return {}
    kernels = {"row_logsumexp": _lse_kernel, "scaled_softmax_": _scaled_softmax_kernel}
    return {name: {k: str(c) for k, c in k_.cache.items()} for name, k_ in kernels.items()}
