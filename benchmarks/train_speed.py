"""Training throughput: vaecf against a plain dense-input PyTorch Mult-VAE, side by side.

vaecf (sparse input, fused output layer) against the textbook dense-input Mult-VAE (batches
densified, log_softmax * x loss, as most public implementations do), on the same synthetic
ML-20M-shaped data, in one run.

    python benchmarks/train_speed.py [--users 136677 --items 20108 --nnz 10000000] [--steps 10]
                                     [--rounds 3] [--device cuda] [--precision P ...]

On a GPU the dense reference densifies each batch on the host and copies it over, as such
implementations do, and vaecf's step is timed as training runs it (one CUDA graph, where
`vaecf train` would replay one); every step is synchronised before its clock is read.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from vaecf import bench
from vaecf import precision as prec
from vaecf.runtime import tune_cpu_allocator


class DenseMultVAE(nn.Module):
    """The textbook dense-input Mult-VAE: [I -> 600 -> 200x2] -> [200 -> 600 -> I]."""

    def __init__(self, n_items: int):
        super().__init__()
        self.enc1, self.enc2 = nn.Linear(n_items, 600), nn.Linear(600, 400)
        self.dec1, self.dec2 = nn.Linear(200, 600), nn.Linear(600, n_items)

    def loss(self, x: torch.Tensor, beta: float) -> torch.Tensor:
        h = F.dropout(F.normalize(x, dim=1), 0.5, self.training)
        h = self.enc2(torch.tanh(self.enc1(h)))
        mu, logvar = h[:, :200], h[:, 200:]
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        logits = self.dec2(torch.tanh(self.dec1(z)))
        nll = -(F.log_softmax(logits, 1) * x).sum(1).mean()
        kl = (0.5 * (-logvar + logvar.exp() + mu**2 - 1)).sum(1).mean()
        return nll + beta * kl


def dense_users_per_s(m, batch_size: int, steps: int, device: torch.device, warmup: int = 3):
    torch.manual_seed(0)
    net = DenseMultVAE(m.shape[1]).to(device).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    times = []
    for i in range(warmup + steps):
        rows = torch.randint(0, m.shape[0], (batch_size,), generator=gen).numpy()
        t0 = time.perf_counter()
        x = torch.from_numpy(m[rows].toarray()).to(device)
        loss = net.loss(x, 0.2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return batch_size / statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=bench.ML20M["users"])
    ap.add_argument("--items", type=int, default=bench.ML20M["items"])
    ap.add_argument("--nnz", type=int, default=bench.ML20M["nnz"])
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of A, B, ... (median shown)")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    ap.add_argument(
        "--precision", action="append", help="vaecf's precisions (default fp32 [+ native bf16])"
    )
    a = ap.parse_args()
    dev = prec.resolve_device(a.device)
    tune_cpu_allocator()
    m = bench.synthetic_csr(a.users, a.items, a.nnz)
    # the machine is shared and its speed drifts: run the contenders in turn, several rounds
    precisions = a.precision or bench.default_precisions(a.device)
    dense = "dense PyTorch (fp32)"
    runs: dict[str, list[float]] = {dense: [], **{f"vaecf ({p})": [] for p in precisions}}
    graphed = False
    for _ in range(a.rounds):
        runs[dense].append(dense_users_per_s(m, a.batch_size, a.steps, dev))
        for p in precisions:
            r = bench.bench_train(
                p, a.batch_size, steps=a.steps, device=a.device, progress=False, data=m
            )
            runs[f"vaecf ({p})"].append(r.users_per_s)
            graphed = graphed or "graph" in r.breakdown_ms
    rows = [(n, statistics.median(v)) for n, v in runs.items()]
    base = rows[0][1]
    print(
        f"{a.users} users x {a.items} items, {m.nnz} interactions, batch {a.batch_size}, "
        f"{torch.get_num_threads()} threads, "
        f"{bench.device_name(dev)}"
    )
    print(f"{'implementation':24s} {'users/s':>9s} {'vs dense':>9s}  per round")
    for name, ups in rows:
        each = " ".join(f"{v:.0f}" for v in runs[name])
        print(f"{name:24s} {ups:9.0f} {ups / base:8.1f}x  {each}")
    if graphed:
        print("(vaecf's steps replayed as one CUDA graph each, as training runs them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
