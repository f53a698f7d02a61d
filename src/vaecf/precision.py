"""Numeric precision: one autocast code path for fp32, tf32, bf16 and fp16 on CPU and CUDA."""

from __future__ import annotations

import contextlib

import torch

from vaecf import runtime
from vaecf.config.settings import TRAIN_PRECISIONS, spelled
from vaecf.errors import ConfigError

PRECISIONS = TRAIN_PRECISIONS


def resolve_device(device: str | None) -> torch.device:
    """'auto'/None -> cuda if available else cpu; otherwise validate the name."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(
            f"--device must be like 'cpu', 'cuda' or 'cuda:1', not {device!r}"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "--device cuda was asked for but no CUDA GPU is visible; use --device cpu"
        )
    return dev


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a GPU's), before a clock is read."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    return set(runtime.cpuinfo().get("flags", "").split())


def native_bf16(device: torch.device) -> bool:
    """Whether `device` does bfloat16 arithmetic in hardware (Ampere+ GPUs; CPUs with
    AVX512-BF16 or AMX), so that bf16 is a speed-up rather than an emulation."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def native_int8_dot() -> bool:
    """Whether this CPU has int8 dot-product instructions (AVX512-VNNI, AVX-VNNI, AMX-INT8)."""
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto' -> bf16 where the device has native bf16, else fp32; other names unchanged."""
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def check_precision(precision: str, device: torch.device) -> None:
    """Every precision runs on every device; on a CPU without native bf16/fp16 arithmetic the
    half-width ones are emulated (correct, and several times slower than fp32)."""
    if precision not in PRECISIONS:
        raise ConfigError(
            f"{spelled('precision')} must be one of {', '.join(PRECISIONS)}, not {precision!r}"
        )


def set_matmul_precision(precision: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"


@contextlib.contextmanager
def _tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    set_matmul_precision("tf32")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def matmul_scope(device: torch.device, precision: str):
    """TF32 matmuls inside (forward and backward) for tf32 on CUDA, restored on exit."""
    return _tf32() if precision == "tf32" and device.type == "cuda" else contextlib.nullcontext()


def autocast(device: torch.device, precision: str):
    """Context manager running the enclosed computation in `precision`: autocast for bf16 and
    fp16, TF32 matmuls for tf32 on CUDA (restored on exit), nothing for fp32. Scoring and
    training both enter it, so a result never depends on what the process did before."""
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return matmul_scope(device, precision)


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Dynamic loss scaling for fp16 (x2 every 2000 finite steps, x0.5 and the step skipped on
    an inf/NaN gradient); disabled otherwise. Works on CUDA and on the CPU."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
