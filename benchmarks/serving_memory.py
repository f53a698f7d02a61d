"""Memory a serving copy holds per `--precision`, for an untrained model of ML-20M's size.

An untrained Mult-VAE (or RecVAE) of 20,108 items, [600] hidden, 200-d latent (trained weights
take the same bytes):

- tensors: the model's parameters and buffers (each storage counted once), and the int8
  rows of fbgemm's packed copies (int8 serving on x86 CPUs without VNNI);
- resident: what the process's resident set grew by from loading the copy and answering a
  recommendation and a similar-items call, which includes what the score function and the
  similar-items vectors hold beside the model, and the same after glibc's malloc_trim (heap
  the loading freed but the allocator kept). Each precision in a fresh process (Linux).

    python benchmarks/serving_memory.py [--items 20108] [--model multvae|recvae]
        [--precisions fp32,bf16,int8]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PRECISIONS = ("fp32", "bf16", "int8")


def tensor_bytes(model) -> int:
    import torch

    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    for m in model.modules():  # fbgemm's packed int8 rows (an opaque object, not a buffer)
        if getattr(m, "packed", None) is not None:
            total += torch.ops.quantized.linear_unpack(m.packed)[0].int_repr().nbytes
    return total


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(run: str, precision: str) -> None:
    import torch

    from vaecf.recommender import Recommender

    torch.zeros(1) @ torch.zeros(1, 1)  # the BLAS library's own buffers count as before
    before = rss()
    rec = Recommender.load(run, precision=precision)
    rec.recommend([1, 2, 3], k=10)
    rec.similar_items(1, k=10)
    grew = rss() - before
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap (load's temporaries) back to the OS
    held = rss() - before
    print(json.dumps({"tensors": tensor_bytes(rec.model), "resident": grew, "trimmed": held}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=20_108)
    p.add_argument("--model", default="multvae")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="fp32,bf16,int8")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(*a.child)
    import torch

    from vaecf import precision as prec
    from vaecf.bench.hardware import cpu_name
    from vaecf.serve.fixtures import fresh_run

    native = prec.native_bf16(torch.device("cpu"))
    cpu = cpu_name()
    print(f"{cpu}, native bf16: {native}, {a.model}, {a.items} items\n")
    print("| precision | MiB of tensors | MiB resident (load + calls) | after malloc_trim |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        run = fresh_run(Path(tmp) / "a", a.items, a.model, seed=0)
        for precision in a.precisions.split(","):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(run), precision],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            got = json.loads(out.strip().splitlines()[-1])
            mib = {k: v / 2**20 for k, v in got.items()}
            print(
                f"| {precision} | {mib['tensors']:.1f} | {mib['resident']:.1f} "
                f"| {mib['trimmed']:.1f} |"
            )


if __name__ == "__main__":
    main()
