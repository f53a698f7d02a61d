"""Serving copies of a model: the same scores from fewer bytes per call.

Scoring one history is bound by reading the item-sized layers once per call (Mult-VAE's output
weight on ML-20M: 20,108 x 600 floats, 48 MB). A serving copy keeps those layers in fewer bytes:

- "bf16" / "fp16": the whole model cast to half width (half the bytes);
- "int8": every layer with one output per item keeps its weight as int8 with one float scale per
  item (row), w ~= scale * q with scale = max|w_row| / 127 (a quarter of the bytes read per
  small-batch call); the rest of the model runs in bf16 where the device does bf16 in hardware,
  else in fp32. Memory: the copy keeps the dequantized weights too (for large batches and for
  similar items), so it holds more than the fp32 model, not less: an ML-20M-sized Mult-VAE
  holds 93.5 MiB of tensors in fp32, 46.8 in bf16 and 105.9 in int8 on a CPU without native
  bf16 (int8 weights plus an fp32 copy; `benchmarks/serving_memory.py`). Keeping one copy is
  left to do.

Small batches (what a server scores) go through PyTorch's weight-only int8 kernel
(`torch._weight_int8pack_mm`); large ones (batch scoring) through an ordinary matrix product
with the dequantized weights, which is faster there. Both compute with the same int8 weights.
The int8 kernel is checked against the dequantized product when the copy is made: where it is
missing or disagrees (a PyTorch build or device without it), the copy uses the dequantized path
for every batch size, which gives the same scores, only slower.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vaecf import precision as prec
from vaecf.errors import ConfigError
from vaecf.models.base import Model, ScoreFn
from vaecf.settings import SERVING_PRECISIONS

INT8_KERNEL_ROWS = 8  # batches up to this many histories use the int8 kernel
_PAD = 64  # the int8 kernel wants the input width in multiples of 64 (garbage otherwise)


class Int8Linear(nn.Module):
    """nn.Linear with a weight-only int8 copy (per-row scales) of `linear`'s weight."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()
        n_out, n_in = w.shape
        scale = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        self.n_in = n_in
        self.pad = -n_in % _PAD
        self.register_buffer("q", F.pad(q, (0, self.pad)).contiguous())
        self.register_buffer("scale", scale.to(dtype))
        self.register_buffer("deq", (q.float() * scale[:, None]).to(dtype))
        bias = linear.bias.detach() if linear.bias is not None else torch.zeros(n_out)
        self.register_buffer("bias", bias.to(dtype))
        self.kernel = self._kernel_works()

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (what the int8 copy computes with)."""
        return self.deq

    def _int8(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, self.pad)) if self.pad else x
        return torch._weight_int8pack_mm(x.contiguous(), self.q, self.scale) + self.bias

    def _kernel_works(self) -> bool:
        if not hasattr(torch, "_weight_int8pack_mm"):
            return False
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(2, self.n_in, generator=gen).to(self.deq)
        want = F.linear(x, self.deq, self.bias).float()
        try:
            got = self._int8(x).float()
        except (RuntimeError, NotImplementedError):
            return False
        tol = 0.02 * float(want.abs().max()) + 1e-3
        return bool(torch.isfinite(got).all()) and float((got - want).abs().max()) <= tol

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.deq.dtype)
        if self.kernel and x.shape[0] <= INT8_KERNEL_ROWS:
            return self._int8(x)
        return F.linear(x, self.deq, self.bias)


def quantize_item_layers(model: Model, dtype: torch.dtype) -> int:
    """Replace, in place, every nn.Linear with one output per item by an Int8Linear; how many."""
    done = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.out_features == model.n_items:
                setattr(parent, name, Int8Linear(child, dtype))
                done += 1
    return done


def serving_copy(model: Model, precision: str = "fp32") -> tuple[Model, ScoreFn]:
    """`model` made ready to serve in `precision` (one of SERVING_PRECISIONS; converted in
    place) and its score function, in eval mode."""
    if precision not in SERVING_PRECISIONS:
        raise ConfigError(
            f"precision must be one of {', '.join(SERVING_PRECISIONS)}, not {precision!r}"
        )
    model.eval()
    if precision in ("bf16", "fp16"):  # a half-width copy: no casts per call
        model = model.to(torch.bfloat16 if precision == "bf16" else torch.float16)
    elif precision == "int8":
        dtype = torch.bfloat16 if prec.native_bf16(model.device) else torch.float32
        model = model.to(dtype)
        if not quantize_item_layers(model, dtype):
            raise ConfigError(
                f"--precision int8 applies to models with an item output layer (Mult-VAE, "
                f"Mult-DAE, RecVAE), not to {model.name}; use bf16 or fp32"
            )
    return model, model.scorer(precision if precision in ("fp32", "tf32") else "fp32")
