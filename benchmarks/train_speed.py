"""Training throughput: vaecf against a plain dense-input PyTorch Mult-VAE, side by side.

vaecf (sparse input, fused output layer) against the textbook dense-input Mult-VAE (batches
densified, log_softmax * x loss, as most public implementations do), on the same synthetic
ML-20M-shaped data, in one run.

    python benchmarks/train_speed.py [--users 136677 --items 20108 --nnz 10000000] [--steps 10]
                                     [--rounds 3] [--device cuda] [--precision P ...]
                                     [--batch-size 500 --batch-size 24576 ...] [--model M ...]

On a GPU the dense reference densifies each batch on the host and copies it over, as such
implementations do, and vaecf's step is timed as training runs it (one CUDA graph, where
`vaecf train` would replay one, with the first-layer kernel training would choose: its name is
shown); every step is synchronised before its clock is read.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from vaecf import precision as prec
from vaecf.bench import hardware
from vaecf.bench import speed as bench
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
    bench.add_shape_arguments(ap)
    ap.add_argument("--batch-size", type=int, action="append", help="default 500; repeatable")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of A, B, ... (median shown)")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    ap.add_argument(
        "--precision", action="append", help="vaecf's precisions (default fp32 [+ native bf16])"
    )
    ap.add_argument(
        "--model", action="append", help="vaecf's models (default multvae; also multdae, recvae)"
    )
    a = ap.parse_args()
    dev = prec.resolve_device(a.device)
    tune_cpu_allocator()
    m = bench.synthetic_csr(a.users, a.items, a.nnz)
    print(
        f"{a.users} users x {a.items} items, {m.nnz} interactions, "
        f"{torch.get_num_threads()} threads, {hardware.device_name(dev)}, torch {torch.__version__}"
    )
    print(
        f"{'batch':>6s} {'implementation':28s} {'users/s':>9s} {'vs dense':>9s} "
        f"{'first layer':>11s}  per round"
    )
    for batch in a.batch_size or [500]:
        table(a, m, dev, batch)
    if dev.type == "cuda":
        print("(vaecf's steps replayed as CUDA graphs, one per phase, as training runs them)")
    return 0


def table(a, m, dev: torch.device, batch: int) -> None:
    """One batch size's rows: the dense reference, then every model and precision, in turn
    (the machine is shared and its speed drifts: several rounds, median shown)."""
    precisions = a.precision or bench.default_precisions(a.device)
    dense = "dense PyTorch Mult-VAE (fp32)"
    names = [(model, p) for model in a.model or ["multvae"] for p in precisions]
    runs: dict[str, list[float]] = {dense: [], **{f"{n} ({p})": [] for n, p in names}}
    kernels: dict[str, set] = {dense: {"dense"}}
    for _ in range(a.rounds):
        runs[dense].append(dense_users_per_s(m, batch, a.steps, dev))
        for model, p in names:
            r = bench.bench_train(
                p, batch, steps=a.steps, device=a.device, progress=False, data=m, model=model
            )
            runs[f"{model} ({p})"].append(r.users_per_s)
            kernels.setdefault(f"{model} ({p})", set()).add(r.first_layer)
    base = statistics.median(runs[dense])
    for name, ups in runs.items():
        each = " ".join(f"{v:.0f}" for v in ups)
        kernel = "/".join(sorted(kernels[name]))
        mid = statistics.median(ups)
        print(f"{batch:6d} {name:28s} {mid:9.0f} {mid / base:8.1f}x {kernel:>11s}  {each}")


if __name__ == "__main__":
    raise SystemExit(main())
