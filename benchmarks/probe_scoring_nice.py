"""Probe: does raising the scoring thread's niceness (`vaecf serve --scoring-nice N`) cut the
tail at concurrency 1? One `vaecf serve` per niceness, alive together, their rounds
interleaved (the order reversed every other round); an untrained Mult-VAE of ml-latest-small's
size, fp32, histories of 10, k = 10. With `--hogs N`: what it costs beside N busy processes
(shell loops at the default niceness): `serve_load.py`'s closed loop at concurrency 1 and 64
(ML-20M's 20,108 items, histories of 50, k = 100), 5 s each, per niceness, twice.

    python benchmarks/probe_scoring_nice.py --nices 0 5 --rounds 20
    python benchmarks/probe_scoring_nice.py --nices 0 5 --hogs 2
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from serve_latency import Client, wait_ready

from vaecf.bench.hardware import cpu_name
from vaecf.serve.fixtures import fresh_run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nices", type=int, nargs="+", default=[0, 5])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--hogs", type=int, default=0)
    a = p.parse_args()
    if a.hogs:
        return contended(a)
    rng = random.Random(0)
    bodies = [json.dumps({"items": rng.sample(range(6946), 10), "k": 10}).encode()
              for _ in range(1000)]  # fmt: skip
    procs, clients = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        run = fresh_run(Path(tmp) / "run", 6946, "multvae")
        try:
            for nice in a.nices:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                cmd = [sys.executable, "-m", "vaecf", "serve", str(run), "--port", str(port),
                       "--precision", "fp32", "--scoring-nice", str(nice)]  # fmt: skip
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))  # fmt: skip
                wait_ready(port, procs[-1])
                clients[nice] = Client(port)
            lat = {n: [] for n in clients}
            for c in clients.values():
                for i in range(300):
                    c.post("/v1/recommend", bodies[i % 1000])
            for r in range(a.rounds):
                for nice, c in list(clients.items())[:: 1 if r % 2 == 0 else -1]:
                    for i in range(a.requests):
                        t0 = time.perf_counter()
                        c.post("/v1/recommend", bodies[i % 1000])
                        lat[nice].append((time.perf_counter() - t0) * 1e3)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    print(f"{cpu_name()}; {a.rounds} x {a.requests} requests per niceness")
    for nice, v in lat.items():
        v = np.asarray(v)
        p50, p90, p99 = np.percentile(v, [50, 90, 99])
        print(f"--scoring-nice {nice}: p50 {p50:.3f} p90 {p90:.3f} p99 {p99:.3f} ms, "
              f"{int((v > 3).sum())} answers over 3 ms")  # fmt: skip


def contended(a) -> None:
    import asyncio

    from serve_client import Server
    from serve_load import load

    print(f"{cpu_name()}; beside {a.hogs} busy processes")
    with tempfile.TemporaryDirectory() as tmp:
        run = fresh_run(Path(tmp) / "a", 20108, "multvae", seed=0)
        for _ in range(2):
            for nice in a.nices:
                with Server(run, 2.0, extra=["--scoring-nice", str(nice)]) as server:
                    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"])
                            for _ in range(a.hogs)]  # fmt: skip
                    try:
                        for c in (1, 64):
                            r = asyncio.run(load(server.base, c, 5.0, 20_000, 20108))
                            print(f"--scoring-nice {nice}, concurrency {c}: {r['req_per_s']} "
                                  f"req/s, p50 {r['p50_ms']} p99 {r['p99_ms']} ms")  # fmt: skip
                    finally:
                        for h in hogs:
                            h.kill()


if __name__ == "__main__":
    main()
