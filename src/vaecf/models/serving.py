"""Serving copies of a model: the same scores from fewer bytes per call.

Scoring one history is bound by reading the item-sized layers once per call (Mult-VAE's output
weight on ML-20M: 20,108 x 600 floats, 48 MB). A serving copy keeps those layers in fewer bytes:

- "bf16" / "fp16": the whole model cast to half width (half the bytes);
- "int8": every layer with one output per item keeps its weight as int8 with one float scale per
  item (row), w ~= scale * q with scale = max|w_row| / 127, and nothing else: a quarter of the
  fp32 bytes for those layers, read per small-batch call and held. The rest of the model runs
  in fp32 where the int8 x int8 product below is used, else in bf16 where the device does bf16
  in hardware. An ML-20M-sized Mult-VAE holds 59.9 MiB of tensors in int8 on a CPU (the
  input layer stays fp32), 93.5 in fp32 and 46.8 in bf16 (`benchmarks/serving_memory.py` gives
  tensors and resident memory).

On CPUs with int8 dot-product instructions (AVX512-VNNI, AVX-VNNI, AMX) every batch is an
int8 x int8 product: each row of the input is quantized to int8 with a scale of its own
(max|x_row| / 127, chosen per call), the products are summed exactly in int32 (`torch._int_mm`,
oneDNN) and scaled back by the row's and the item's scales. On a 2-core Zen 4, at batch 1 and
20,108 items, the layer takes 0.21 ms against 0.39 ms for PyTorch's weight-only int8 kernel
(bf16 activations) and 2.5 ms dequantized (probe int8_paths: benchmarks/README.md).
Without those instructions oneDNN's int8 product either saturates its 16-bit intermediate
sums and gives wrong answers (with oneDNN held to AVX2, 99% of a random product's entries
wrong) or is exact and slow (a Zen 3: 8.0 ms for that layer), so `int8_products` refuses it.
There, on x86, batches of up to INT8_KERNEL_ROWS go through fbgemm's dynamically quantized
product (`torch.ops.quantized.linear_dynamic`: the input quantized to 7-bit unsigned per call,
so that AVX2's 16-bit pair sums cannot saturate; int32 accumulation): on that Zen 3 the layer
takes 0.55 ms, and a whole batch-1 answer 1.75 ms (p99 2.4) against fp32's 4.6 (p99 6.2-7.3;
`vaecf bench infer`, benchmarks/README.md; 25% less since the small layers of one history run
in numpy, models/onerow.py). fbgemm reads its own packed copy of the
int8 rows, so the layer then holds them twice (half the fp32 bytes, not a quarter). Elsewhere
small batches go through the weight-only kernel (`torch._weight_int8pack_mm`); larger batches
dequantize DEQ_ROWS weight rows at a time into an ordinary product; so do devices where a
product is missing (CUDA's `_int_mm` wants more than 16 rows). Every path computes with the
same int8 weights, and each is checked against the dequantized product when the copy is made.

"fp32" / "tf32" on a CPU store the item layers' weights transposed (see
`transpose_item_layers`): the fast layout for small batches, without a second copy.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from vaecf import precision as prec
from vaecf.config.settings import SERVING_PRECISIONS
from vaecf.errors import ConfigError
from vaecf.models.base import Model, ScoreFn

INT8_KERNEL_ROWS = 16  # without int8 x int8: batches up to this many use the weight-only kernel
DEQ_ROWS = 2048  # and larger batches dequantize this many weight rows at a time
_TINY = torch.finfo(torch.float32).tiny
_PINS = torch.tensor([1.0, -1.0])  # fbgemm's range pinned to [-1, 1] (Int8Linear._fbgemm)
_PAD = 64  # the weight-only kernel wants the input width in multiples of 64 (garbage otherwise)


class Int8Linear(nn.Module):
    """nn.Linear's product from a weight-only int8 copy (per-row scales) of `linear`'s weight.

    It keeps one copy of the weight: the int8 rows and a scale per row (no dequantized copy).
    `small` and `large` name how it multiplies batches of up to INT8_KERNEL_ROWS rows and
    larger ones, each a path that works on the weight's device (checked against the
    dequantized product here): "int8", an int8 x int8 product with each input row quantized to
    int8 per call (int32 accumulation, then the row's and the item's scales); "kernel",
    PyTorch's weight-only int8 kernel with bf16 activations (small batches only); "fbgemm",
    fbgemm's dynamically quantized product from its packed copy of the rows, each input row
    rounded to 7 bits (x86 CPUs, small batches only); "blocks", DEQ_ROWS rows at a time
    dequantized into an ordinary product in `dtype`.
    """

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach()
        n_out, n_in = w.shape
        self.n_in, self.dtype = n_in, dtype
        self.pad = -n_in % _PAD
        q = torch.zeros(n_out, n_in + self.pad, dtype=torch.int8, device=w.device)
        scale = torch.empty(n_out, device=w.device)
        for s in range(0, n_out, DEQ_ROWS):  # a block at a time: no weight-sized temporaries
            rows = w[s : s + DEQ_ROWS].float()
            scale[s : s + DEQ_ROWS] = rows.abs().amax(dim=1).clamp_min(_TINY) / 127.0
            rows = torch.round(rows / scale[s : s + DEQ_ROWS, None]).clamp_(-127, 127)
            q[s : s + DEQ_ROWS, :n_in] = rows.to(torch.int8)
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)  # fp32 (n_out floats): exact dequantized rows
        self.register_buffer("scale16", scale.to(torch.bfloat16))  # the kernel's scales
        bias = linear.bias.detach() if linear.bias is not None else torch.zeros(n_out)
        self.register_buffer("bias", bias.to(dtype))
        self.packed = None  # fbgemm's packed int8 rows, made when that path is tried
        self.small, self.large = self._pick_paths()
        if self.small != "fbgemm":
            self.packed = None

    @property
    def weight(self) -> torch.Tensor:
        """The int8 rows (a view, no copy; zero columns pad the width to a multiple of 64).
        Each row is the weight's row over its scale, so cosines between rows are the
        dequantized weight's: what similar items use."""
        return self.q

    def dequantized(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start:stop of the dequantized weight, (rows, n_in) in `dtype` (a new tensor)."""
        rows = self.q[start:stop, : self.n_in].float() * self.scale[start:stop, None]
        return rows.to(self.dtype)

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        return (F.pad(x, (0, self.pad)) if self.pad else x).contiguous()

    def _int8(self, x: torch.Tensor) -> torch.Tensor:
        """Both sides in int8: x's rows quantized with a scale each, products summed in int32."""
        x = x.float()
        xs = (x.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(_TINY)  # (B, 1)
        xq = self._padded(torch.round(x / xs).to(torch.int8))  # |x / xs| <= 127
        out = torch._int_mm(xq, self.q.t()).float()  # (B, n_out), exact sums of int8 products
        out.mul_(xs).mul_(self.scale)
        return out.to(self.dtype).add_(self.bias)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        out = torch._weight_int8pack_mm(self._padded(x.to(torch.bfloat16)), self.q, self.scale16)
        return out.to(self.dtype) + self.bias

    def _fbgemm(self, x: torch.Tensor) -> torch.Tensor:
        """fbgemm quantizes the whole batch with one range, its min and max: each row is scaled
        to max |x| = 1 and two columns of +1 and -1 (zero weights) pin that range to [-1, 1],
        so a row's scores do not depend on the other rows of its batch."""
        if self.packed is None:
            w = F.pad(self.dequantized().float(), (0, 2))  # q * scale; / scale gives q again
            with warnings.catch_warnings():  # PyTorch's quantized tensors are deprecated (in
                warnings.simplefilter("ignore")  # favour of torchao); the pinned 2.13 has them
                w = torch.quantize_per_channel(
                    w, self.scale.double(), torch.zeros(len(w), dtype=torch.long), 0, torch.qint8
                )
            self.packed = torch.ops.quantized.linear_prepack(w, None)
        x = x.float()
        s = x.abs().amax(dim=1, keepdim=True).clamp_min(_TINY)
        out = torch.ops.quantized.linear_dynamic(
            torch.cat([x / s, _PINS.expand(x.shape[0], 2)], 1), self.packed, True
        )
        return out.mul_(s).to(self.dtype).add_(self.bias)

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        n_out = self.q.shape[0]
        if n_out <= DEQ_ROWS:
            return F.linear(x, self.dequantized(), self.bias)
        out = torch.empty(x.shape[0], n_out, dtype=self.dtype, device=x.device)
        for s in range(0, n_out, DEQ_ROWS):
            e = min(s + DEQ_ROWS, n_out)
            out[:, s:e] = F.linear(x, self.dequantized(s, e), self.bias[s:e])
        return out

    def _works(self, path: str) -> bool:
        """Whether `path` gives the dequantized product's answer on this device."""
        if path == "blocks":
            return True
        available = {
            "int8": lambda: int8_products(self.q.device.type),
            "kernel": lambda: hasattr(torch, "_weight_int8pack_mm"),
            "fbgemm": lambda: (
                self.q.device.type == "cpu"
                and "fbgemm" in torch.backends.quantized.supported_engines
            ),
        }
        if not available[path]():
            return False
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(3, self.n_in, generator=gen).to(self.q.device, torch.bfloat16)
        want = self._blocks(x).float()
        try:
            got = getattr(self, f"_{path}")(x).float()
        except (RuntimeError, NotImplementedError):
            return False
        tol = 0.02 * float(want.abs().max()) + 1e-3
        return bool(torch.isfinite(got).all()) and float((got - want).abs().max()) <= tol

    def _pick_paths(self) -> tuple[str, str]:
        """(small, large): the paths for batches up to INT8_KERNEL_ROWS and above."""
        if self._works("int8"):
            return "int8", "int8"
        small = next((p for p in ("fbgemm", "kernel") if self._works(p)), "blocks")
        return small, "blocks"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        path = self.small if x.shape[0] <= INT8_KERNEL_ROWS else self.large
        return getattr(self, f"_{path}")(x)


@functools.cache
def int8_products(device_type: str) -> bool:
    """Whether `torch._int_mm` multiplies int8 by int8 exactly, and fast, on this kind of
    device at a batch of one: CPUs with int8 dot-product instructions (VNNI, AMX); not CUDA
    (its `_int_mm` wants more than 16 rows). Without those instructions oneDNN's product is
    wrong (it saturates, with oneDNN held to AVX2) or exact and slow (a Zen 3: 8.0 ms at batch 1
    and 20,108 items, where fbgemm takes 0.6)."""
    if not hasattr(torch, "_int_mm") or (device_type == "cpu" and not prec.native_int8_dot()):
        return False
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (1, 64), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (24, 64), dtype=torch.int8, generator=gen)
    try:
        got = torch._int_mm(a.to(device_type), b.to(device_type).t()).cpu()
    except (RuntimeError, NotImplementedError):
        return False
    return bool((got.long() == a.long() @ b.long().t()).all())


def quantize_item_layers(model: Model, dtype: torch.dtype) -> int:
    """Replace, in place, every nn.Linear with one output per item by an Int8Linear; how many."""
    done = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.out_features == model.n_items:
                setattr(parent, name, Int8Linear(child, dtype))
                done += 1
    return done


def transpose_item_layers(model: Model) -> int:
    """Store, in place, the weight of every nn.Linear with one output per item transposed
    (a (in, out) contiguous tensor seen as its (out, in) transpose): the layout an fp32 product
    on a CPU reads fastest at small batches, so a score function needs no second copy."""
    done = 0
    for m in model.modules():
        if isinstance(m, nn.Linear) and m.out_features == model.n_items:
            m.weight.data = m.weight.data.t().contiguous().t()
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
    elif model.device.type == "cpu" and precision in ("fp32", "tf32"):
        transpose_item_layers(model)
    elif precision == "int8":
        # with int8 x int8 products the other layers run in fp32, the fastest at small batches;
        # else bf16 activations feed the weight-only kernel where bf16 is native
        int8 = int8_products(model.device.type)
        dtype = torch.bfloat16 if prec.native_bf16(model.device) and not int8 else torch.float32
        model = model.to(dtype)
        if not quantize_item_layers(model, dtype):
            raise ConfigError(
                f"--precision int8 applies to models with an item output layer (Mult-VAE, "
                f"Mult-DAE, RecVAE), not to {model.name}; use bf16 or fp32"
            )
    return model, model.scorer(precision if precision in ("fp32", "tf32") else "fp32")
