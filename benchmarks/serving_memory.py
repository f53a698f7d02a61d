"""Bytes held by a serving copy's tensors (parameters and buffers, each storage counted once)
per `--precision`, for an untrained Mult-VAE of ML-20M's size (20,108 items, [600] hidden,
200-d latent; trained weights take the same bytes).

    python benchmarks/serving_memory.py [--items 20108]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

from vaecf import precision as prec
from vaecf.recommender import Recommender
from vaecf.serve.fixtures import fresh_run


def tensor_bytes(model) -> int:
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=20_108)
    a = p.parse_args()
    import torch

    native = prec.native_bf16(torch.device("cpu"))
    print(f"{platform.processor() or platform.machine()}, native bf16: {native}, {a.items} items\n")
    print("| precision | MiB of tensors |")
    print("|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        run = fresh_run(Path(tmp) / "a", a.items, "multvae", seed=0)
        for precision in ("fp32", "bf16", "int8"):
            model = Recommender.load(run, precision=precision).model
            print(f"| {precision} | {tensor_bytes(model) / 2**20:.1f} |")


if __name__ == "__main__":
    main()
