"""What an explanation costs: served p50/p99 of POST /v1/recommend with and without "explain".

A real `vaecf serve` subprocess per model at ML-1M's size (3,706 items), untrained (random
weights cost what trained ones do): EASE (explained exactly: B's rows over the history) and
Mult-VAE (the paper's network; explained by leave-one-out, every history minus each of its items
scored in one batched pass). Histories of 10 and 500 random items, k = 10, concurrency 1 over
one keep-alive connection; with and without explain alternate request by request, so that both
see the same machine.

    python benchmarks/explain_latency.py                       # 300 requests per cell
    python benchmarks/explain_latency.py --requests 5 --items 300 --models ease   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
from pathlib import Path

from serve_client import Connection, Server, pct

from vaecf.bench import hardware
from vaecf.serve.fixtures import fresh_run

ML1M_ITEMS = 3_706  # ML-1M's catalogue (movies rated at least once)


async def _cell(port: int, histories: list, k: int) -> dict:
    """p50/p99 ms with and without explain, alternating, over `histories`."""
    conn = Connection("127.0.0.1", port)
    times: dict[bool, list[float]] = {False: [], True: []}
    loop = asyncio.get_running_loop()
    for h in histories:
        for explain in (False, True):
            body = json.dumps({"items": h, "k": k, "explain": explain}).encode()
            t0 = loop.time()
            status, data = await conn.post("/v1/recommend", body)
            times[explain].append(loop.time() - t0)
            if status != 200:
                raise SystemExit(f"HTTP {status}: {data[:200]!r}")
    conn.close()
    return {e: (pct(t, 50), pct(t, 99)) for e, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=ML1M_ITEMS)
    ap.add_argument("--models", default="ease,multvae")
    ap.add_argument("--histories", default="10,500", help="history lengths")
    ap.add_argument("--requests", type=int, default=300, help="per cell and side")
    ap.add_argument("-k", type=int, default=10)
    a = ap.parse_args()
    rng = random.Random(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            run = fresh_run(Path(tmp) / model, a.items, model)
            with Server(run, batch_wait_ms=0) as server:
                for n in map(int, a.histories.split(",")):
                    hist = [rng.sample(range(a.items), min(n, a.items)) for _ in range(a.requests)]
                    asyncio.run(_cell(server.port, hist[:5], a.k))  # warm-up
                    got = asyncio.run(_cell(server.port, hist, a.k))
                    rows.append((model, n, got))
    print(f"\n{hardware.machine()}")
    print(f"command: python benchmarks/explain_latency.py --items {a.items} --requests "
          f"{a.requests}; {a.items} items, k={a.k}, concurrency 1")  # fmt: skip
    print("| model | history | p50 ms | p99 ms | explain p50 ms | explain p99 ms | p50 ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model, n, got in rows:
        (p50, p99), (e50, e99) = got[False], got[True]
        ratio = e50 / p50 if p50 else float("nan")
        print(f"| {model} | {n} | {p50} | {p99} | {e50} | {e99} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
