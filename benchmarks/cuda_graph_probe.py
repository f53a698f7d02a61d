"""What launching kernels costs a Mult-VAE training step on a GPU, and what a CUDA graph of the
whole step (batch gather, forward, backward, Adam) would buy: a probe, not a code path of vaecf.

    python benchmarks/cuda_graph_probe.py [--device cuda] [--steps 50] [--precision fp32 ...]

Variants, each timed over the same batches with one synchronisation at the end (as training):
- eager: what the trainer does today (`CSR.batch`, whose `int(lens.sum())` waits on the GPU);
- padded: the batch gathered into a fixed number of non-zeros without reading anything back
  (padding entries: item 0, value 0, in the last row; they add exactly zero to every sum);
- graph: the padded step captured once as a CUDA graph and replayed (Adam capturable);
- *-ia: the first layer as a gather and index_add instead of embedding_bag.
Before timing, one padded step's loss is checked against the eager step's on the same batch and
weights, and the operations that synchronise with the host are listed (sync debug mode).
On a CPU only eager and padded run (the padded gather's correctness is what can be checked).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import torch
import torch.nn.functional as F

from vaecf import bench, models
from vaecf import precision as prec
from vaecf.data.matrix import CSR, SparseBatch


def encode_index_add(net, batch: SparseBatch):
    """Mult-VAE's encoder with the first layer as gather + index_add instead of embedding_bag
    (whose CUDA backward reads a count back to the host, which a graph cannot capture)."""
    v = batch.values
    inv_norm = torch.rsqrt(batch.row_sums(v * v).clamp_min(1e-12))
    v = F.dropout(v * inv_norm[batch.row_ids], net.config.dropout, net.training)
    parts = net.in_weight.index_select(0, batch.indices) * v.to(net.in_weight.dtype)[:, None]
    h = torch.zeros(batch.batch_size, parts.shape[1], dtype=parts.dtype, device=parts.device)
    h = net._encode_rest(h.index_add_(0, batch.row_ids, parts) + net.in_bias)
    d = net.config.latent_dim
    return h[:, :d], h[:, d:]


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(variant, csr, batches, capacity, precision, dev, n_items, seed=0):
    torch.manual_seed(seed)
    net = models.build("multvae", n_items).to(dev).train()
    if variant.endswith("-ia"):
        net.encode = lambda batch: encode_index_add(net, batch)
    opt = torch.optim.Adam(
        net.parameters(), lr=1e-3, fused=True, capturable=variant.startswith("graph")
    )
    beta = torch.zeros((), device=dev)
    rows_buf = batches[0].clone()

    def step(rows):
        b = csr.batch(rows) if variant == "eager" else csr.padded_batch(rows, capacity)
        with prec.matmul_scope(dev, precision), prec.autocast(dev, precision):
            loss, parts = net.loss(b, beta, rows.numel())
        loss.backward()
        opt.step()
        return parts["nll_sum"]

    replay = None
    if variant.startswith("graph"):
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                step(rows_buf)
        torch.cuda.current_stream(dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_nll = step(rows_buf)

        def replay(rows):
            rows_buf.copy_(rows)
            g.replay()
            return static_nll

    total = torch.zeros((), dtype=torch.float64, device=dev)
    warm = 3
    for i, rows in enumerate(batches):
        if i == warm:
            _sync(dev)
            t0 = time.perf_counter()
        beta.fill_(min(0.2, i / 1000))
        if replay is not None:
            nll = replay(rows)
        else:
            opt.zero_grad(set_to_none=True)
            nll = step(rows)
        total += nll
    _sync(dev)
    secs = time.perf_counter() - t0
    n = len(batches) - warm
    return n * rows_buf.numel() / secs, secs / n * 1e3, float(total) / len(batches)


def check_padded(csr, rows, capacity, dev, n_items):
    """One step's loss and gradients, eager batch against the padded one, same weights."""
    out = []
    for pad in (False, True):
        torch.manual_seed(1)
        net = models.build("multdae", n_items).to(dev).eval()  # no sampling, no dropout
        b = csr.padded_batch(rows, capacity) if pad else csr.batch(rows)
        loss, _ = net.loss(b, 0.0, rows.numel())
        loss.backward()
        out.append((loss.item(), net.in_weight.grad.clone(), net.decoder[-1].weight.grad.clone()))
    (l0, a0, w0), (l1, a1, w1) = out
    return abs(l0 - l1) / abs(l0), (a0 - a1).abs().max().item(), (w0 - w1).abs().max().item()


def list_syncs(csr, rows, dev, n_items):
    """The warnings of CUDA's sync debug mode over one eager step."""
    net = models.build("multvae", n_items).to(dev).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
    torch.cuda.synchronize(dev)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss, _ = net.loss(csr.batch(rows), 0.2, rows.numel())
            loss.backward()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sorted({str(w.message).splitlines()[0][:120] for w in caught})


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
    a = ap.parse_args()
    dev = prec.resolve_device(a.device)
    m = bench.synthetic_csr(a.users, a.items, a.nnz)
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
    rel, da, dw = check_padded(csr, batches[0], capacity, dev, a.items)
    print(
        f"padded vs eager, one Mult-DAE step: loss rel diff {rel:.2e}, first-layer grad max "
        f"diff {da:.2e}, output-layer grad max diff {dw:.2e}"
    )
    if dev.type == "cuda":
        for line in list_syncs(csr, batches[0], dev, a.items):
            print("sync:", line)
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
                    res[v].append(run(v, csr, batches, capacity, p, dev, a.items))
                except Exception as e:  # a probe: report what fails and go on
                    failed.add(v)
                    print(f"{p} {v}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        for v, rs in res.items():
            ok = rs
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
