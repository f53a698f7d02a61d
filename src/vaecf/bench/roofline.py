"""A training step and a batch-1 answer against this machine's own ceilings, so that every CPU
can judge its figures: a CPU's rate for a matrix product depends on the product's shape and on
its operands' layout (on an AMX CPU bf16 products run at 300-2,100 GFLOP/s by layout alone), so
one "GFLOP/s" goal set on one CPU cannot be judged on another.

- `products`: the dense products of a Mult-VAE/DAE training step (each layer's forward, input
  gradient and weight gradient), each timed alone at this CPU's best measured rate for its shape
  over the four operand layouts; the step's time over their sum is what `vaecf bench train`
  reports (goal: fp32 <= 1.3, bf16 where native <= 1.5). The sparse first layer, the softmax and
  the optimizer are not products: they are what the ratio leaves room for.
- `read_bandwidth`: the bytes a second this machine reads from memory, which bounds a batch-1
  answer (reading the output layer once); `vaecf bench infer` reports p99 over that time
  (goal: <= 2 for int8).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

GOALS = {"fp32": 1.3, "bf16": 1.5}  # step / sum of products (bf16: where the CPU has it natively)
INT8_GOAL = 2.0  # batch-1 p99 / the time to read the int8 output layer


@dataclass(frozen=True)
class Product:
    name: str
    m: int
    k: int
    n: int
    ms: float  # at the best measured layout
    layout: str  # "NN", "NT", "TN" or "TT": which operands were stored transposed

    @property
    def gflops(self) -> float:
        return 2.0 * self.m * self.k * self.n / self.ms / 1e6


def step_shapes(model, batch: int) -> list[tuple[str, int, int, int]]:
    """(name, m, k, n) of each dense product C (m x n) = A (m x k) @ B (k x n) of one training
    step of a Mult-VAE/DAE: for each nn.Linear after the sparse first layer, its forward, its
    input gradient and its weight gradient."""
    layers = [(f"encoder {i + 1}", m) for i, m in enumerate(model.encoder)]
    layers += [(f"decoder {i + 1}", m) for i, m in enumerate(model.decoder)]
    layers[-1] = ("output layer", layers[-1][1])
    shapes = []
    for name, layer in layers:
        out, inp = layer.weight.shape
        shapes += [
            (f"{name} forward", batch, inp, out),
            (f"{name} input grad", batch, out, inp),
            (f"{name} weight grad", out, batch, inp),
        ]
    return shapes


def best_product_ms(m: int, k: int, n: int, dtype: torch.dtype, reps: int = 3) -> tuple:
    """(median ms at the fastest layout, that layout) of A (m x k) @ B (k x n) in `dtype`, over
    A and B each stored as is or transposed (a transposed view of a contiguous array)."""
    gen = torch.Generator().manual_seed(0)
    best = (float("inf"), "")
    for a_t in (False, True):
        for b_t in (False, True):
            a = torch.randn((k, m) if a_t else (m, k), generator=gen).to(dtype)
            b = torch.randn((n, k) if b_t else (k, n), generator=gen).to(dtype)
            a, b = (a.t() if a_t else a), (b.t() if b_t else b)
            torch.mm(a, b)  # warm-up
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                torch.mm(a, b)
                times.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(times)
            if ms < best[0]:
                best = (ms, ("T" if a_t else "N") + ("T" if b_t else "N"))
    return best


def products(model, batch: int, precision: str) -> list[Product]:
    """The step's dense products, each at this CPU's best measured rate for its shape."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    seen: dict[tuple, tuple] = {}
    out = []
    for name, m, k, n in step_shapes(model, batch):
        if (m, k, n) not in seen:
            seen[(m, k, n)] = best_product_ms(m, k, n, dtype)
        ms, layout = seen[(m, k, n)]
        out.append(Product(name, m, k, n, ms, layout))
    return out


def read_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
    """Bytes a second this process reads from memory: a sum over a float32 array several times
    the size of any cache, median of `reps`."""
    x = torch.ones(nbytes // 4)
    x.sum()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def format_step(step_ms: float, precision: str, batch: int, rows: list[Product]) -> str:
    """The products' table and the step's ratio to their sum, against the goal."""
    total = sum(p.ms for p in rows)
    lines = [
        f"{precision} step at batch {batch}: each dense product at this CPU's best measured rate "
        "for its shape (any layout)",
        f"  {'product':28s} {'m x k x n':>22s} {'layout':>6s} {'ms':>8s} {'GFLOP/s':>8s}",
    ]
    for p in rows:
        shape = f"{p.m} x {p.k} x {p.n}"
        lines.append(f"  {p.name:28s} {shape:>22s} {p.layout:>6s} {p.ms:8.2f} {p.gflops:8.1f}")
    goal = GOALS.get(precision)
    verdict = (
        ""
        if goal is None
        else f" (goal <= {goal}: {'met' if step_ms / total <= goal else 'not met'})"
    )
    lines.append(
        f"  sum of products {total:.1f} ms; step {step_ms:.1f} ms; step / products "
        f"{step_ms / total:.2f}{verdict}"
    )
    return "\n".join(lines)


def output_layer_bytes(model: torch.nn.Module) -> int | None:
    """Bytes of an autoencoder's output layer (what a batch-1 answer reads whole): its decoder's
    last layer (Mult-VAE/DAE), or its one-layer decoder (RecVAE); None without a decoder."""
    decoder = getattr(model, "decoder", None)
    if decoder is None:
        return None
    return layer_bytes(decoder[-1] if isinstance(decoder, torch.nn.ModuleList) else decoder)


def layer_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (what a call reads at least once)."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())
