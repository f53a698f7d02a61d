"""The machine a figure was measured on, for the caption of every benchmark table: the CPU's
name, family and model, the vector flags that decide the figures, the threads, torch, the GPU.
Figures from different machines never compare; ratios from one run do."""

from __future__ import annotations

import platform

import torch

from vaecf import precision as prec
from vaecf import runtime


def cpu_name() -> str:
    """The CPU's model name and its family and model numbers (/proc/cpuinfo), for benchmark
    tables: figures from different CPUs never compare, and a virtual machine's name alone ("AMD
    EPYC") does not tell Zen 3 (family 25 model 1) from Zen 4 (25/17) or Zen 5 (26/2)."""
    fields = runtime.cpuinfo()
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" family {fields['cpu family']} model {fields['model']}"
    return name


def machine() -> str:
    """The CPU, its vector flags that decide the figures, the threads and torch, for the
    caption of a benchmark table."""
    flags = prec.cpu_flags()
    decide = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx_vnni", "avx512_vnni", "amx_int8")
    have = [f for f in decide if f in flags]  # bf16 training, int8 serving (VNNI: int8 x int8)
    return (
        f"{cpu_name()} ({', '.join(have) or 'no AVX2'}), {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )


def device_name(device: str | torch.device) -> str:
    """The GPU's name for a CUDA device, else the CPU's, for benchmark tables."""
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
