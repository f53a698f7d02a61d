"""What launching kernels costs a Mult-VAE training step on a GPU, and what replaying the whole
step (batch gather, forward, backward, Adam) as a CUDA graph buys.

    python benchmarks/cuda_graph_probe.py [--device cuda] [--steps 50] [--precision fp32 ...]
                                          [--model recvae]

Variants, each timed over the same batches with one synchronisation at the end (as training):
- eager: the step without graphs (`CSR.batch`, whose `int(lens.sum())` waits on the GPU);
- padded: the batch gathered into a fixed number of non-zeros without reading anything back
  (`CSR.padded_batch`);
- graph: the padded step replayed as a CUDA graph (`graphs.GraphedStep`, what training does);
- with -ia, the first layer as gather + index_add, else embedding_bag (training on a GPU uses
  the gather: `models.base.sparse_rows_product`).
On a CPU the graph variants are left out. `--model recvae` times RecVAE's epoch step (3 encoder
updates, 1 decoder update; `vaecf bench train`'s timing) eager and as one graph per phase, with
its first layer inside the graphs as gather + index_add (what it trains with) or as
embedding_bag (graph-bag).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time

import torch

from vaecf import bench, graphs, models
from vaecf import precision as prec
from vaecf.data.matrix import CSR
from vaecf.models import multvae, recvae
from vaecf.models.base import sparse_rows_product


@contextlib.contextmanager
def first_layer(gather: bool, module=multvae):
    """The model's first layer fixed to embedding_bag or to gather + index_add (Mult-VAE
    training on a GPU picks the gather), for the comparison."""
    module.sparse_rows_product = lambda b, w, v, _=None: sparse_rows_product(b, w, v, gather)
    try:
        yield
    finally:
        module.sparse_rows_product = sparse_rows_product


def recvae_steps(m, a, dev) -> None:
    """RecVAE's epoch step through bench.bench_train: eager, graphs, graphs with embedding_bag."""
    variants = ["eager"] + (["graph", "graph-bag"] if dev.type == "cuda" else [])
    for p in a.precision or ["fp32"]:
        res: dict[str, list] = {v: [] for v in variants}
        for _ in range(a.rounds):
            for v in variants:
                bag = first_layer(False, recvae) if v == "graph-bag" else contextlib.nullcontext()
                with bag:
                    r = bench.bench_train(
                        p, a.batch_size, steps=a.steps, warmup=3, device=str(dev),
                        model="recvae", progress=False, data=m, cuda_graphs=v != "eager",
                    )  # fmt: skip
                res[v].append(r.users_per_s)
        for v, ups in res.items():
            print(
                f"recvae {p:5s} {v:9s} {sorted(ups)[len(ups) // 2]:10.0f} users/s  rounds "
                + " ".join(f"{u:.0f}" for u in ups)
            )


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(variant, csr, batches, capacity, precision, dev, n_items, seed=0):
    """(users/s, ms a step, mean NLL) of `variant` over `batches`, timed after 3 steps."""
    torch.manual_seed(seed)
    net = models.build("multvae", n_items).to(dev).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
    size = batches[0].numel()
    if variant.startswith("graph"):  # what the trainer replays
        graph = graphs.GraphedStep(net, [opt], csr, size, precision, capacity)

        def step(rows, beta):
            return graph(rows, beta)["nll_sum"]
    else:

        def step(rows, beta):
            b = csr.batch(rows) if variant == "eager" else csr.padded_batch(rows, capacity)
            opt.zero_grad(set_to_none=True)
            with prec.autocast(dev, precision):
                loss, parts = net.loss(b, beta, size)
            loss.backward()
            opt.step()
            return parts["nll_sum"]

    total = torch.zeros((), dtype=torch.float64, device=dev)
    warm = 3
    for i, rows in enumerate(batches):
        if i == warm:
            _sync(dev)
            t0 = time.perf_counter()
        total += step(rows, min(0.2, i / 1000))
    _sync(dev)
    secs = time.perf_counter() - t0
    n = len(batches) - warm
    return n * size / secs, secs / n * 1e3, float(total) / len(batches)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--users", type=int, default=bench.ML20M["users"])
    ap.add_argument("--items", type=int, default=bench.ML20M["items"])
    ap.add_argument("--nnz", type=int, default=bench.ML20M["nnz"])
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precision", action="append")
    ap.add_argument("--model", default="multvae", choices=["multvae", "recvae"])
    a = ap.parse_args()
    dev = prec.resolve_device(a.device)
    m = bench.synthetic_csr(a.users, a.items, a.nnz)
    if a.model == "recvae":
        print(f"{bench.device_name(dev)}; torch {torch.__version__}; batch {a.batch_size}")
        recvae_steps(m, a, dev)
        return 0
    csr = CSR.from_scipy(m, dev)
    gen = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(0, a.users, (a.batch_size,), generator=gen) for _ in range(a.steps + 3)
    ]
    row_nnz = torch.from_numpy(m.indptr[1:] - m.indptr[:-1])
    need = max(int(row_nnz[b].sum()) for b in batches)
    capacity = math.ceil(need / 4096) * 4096
    batches = [b.to(dev) for b in batches]
    print(
        f"{bench.device_name(dev)}; torch {torch.__version__}; batch {a.batch_size}, "
        f"non-zeros per batch up to {need} (capacity {capacity})"
    )
    variants = ["eager", "padded", "padded-ia"]
    # the index_add graph first: a capture that fails may leave the CUDA context unusable
    variants += ["graph-ia", "graph"] if dev.type == "cuda" else []
    failed: set[str] = set()
    for p in a.precision or ["fp32"]:
        res: dict[str, list] = {v: [] for v in variants}
        for _ in range(a.rounds):
            for v in variants:
                if v in failed:
                    continue
                try:
                    with first_layer(gather=v.endswith("-ia")):
                        res[v].append(run(v, csr, batches, capacity, p, dev, a.items))
                except Exception as e:  # a probe: report what fails and go on
                    failed.add(v)
                    print(f"{p} {v}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        for v, ok in res.items():
            if not ok:
                continue
            ups = sorted(r[0] for r in ok)[len(ok) // 2]
            ms = sorted(r[1] for r in ok)[len(ok) // 2]
            print(
                f"{p:5s} {v:9s} {ups:10.0f} users/s {ms:7.2f} ms/step  mean NLL "
                f"{ok[-1][2]:.1f}  rounds {' '.join(f'{r[0]:.0f}' for r in ok)}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
