"""Load test of `vaecf serve`: requests/s and latency percentiles of POST /v1/recommend.

At several concurrencies, with and without micro-batching, and one run during which the model
is reloaded (`--modes` picks among the three). `--overload` offers a multiple of the measured
capacity, open loop. (Hostile load and the SIGKILL drill: serve_hostile.py; both take the server
and the client from serve_client.py.)

The server is a real `vaecf serve` subprocess on 127.0.0.1 serving an untrained Mult-VAE of
ML-20M's size (20,108 items, the paper's [600] hidden layer and 200-d latent; scores of random
weights cost what trained ones do). The client is a bounded asyncio loop with a minimal
HTTP/1.1 client: `concurrency` workers, each on its own keep-alive connection, send one request
at a time (one of 1,000 histories of 50 random items made beforehand, k=100) until `duration`
seconds or `max_requests` requests, whichever comes first. Client and server share the
machine's cores, so on a small machine the client's own CPU use is part of what is measured.

    python benchmarks/serve_load.py                      # 5 s per cell, concurrency 1 16 64
    python benchmarks/serve_load.py --duration 10 --concurrency 1 8 --json
    python benchmarks/serve_load.py --overload 4 --concurrency 16 64   # 4x capacity, open loop
    python benchmarks/serve_load.py --items 100 --duration 0.5 --concurrency 2 --modes batched
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
from serve_client import ML20M_ITEMS, Connection, Server, pct

from vaecf.bench.speed import bench_infer
from vaecf.serve.fixtures import fresh_run


def _bodies(seed: int, n_items: int) -> list[bytes]:
    """1,000 request bodies of 50 random items each (k=100), made before any clock starts."""
    rng = random.Random(seed)
    return [
        json.dumps({"items": rng.sample(range(n_items), 50), "k": 100}).encode()
        for _ in range(1000)
    ]


async def load(
    base: str,
    concurrency: int,
    duration: float,
    max_requests: int,
    n_items: int,
    reload_run: Path | None = None,
    seed: int = 0,
) -> dict:
    host, port = base.removeprefix("http://").split(":")
    bodies = _bodies(seed, n_items)
    latencies: list[float] = []
    errors = 0
    models: set[str] = set()
    sent = 0
    conns = [Connection(host, int(port)) for _ in range(concurrency)]
    for conn in conns:  # warm-up: connections, first-call costs
        await conn.post("/v1/recommend", bodies[0])
    t_end = time.perf_counter() + duration

    async def worker(conn: Connection) -> None:
        nonlocal sent, errors
        while time.perf_counter() < t_end and sent < max_requests:
            body = bodies[sent % len(bodies)]
            sent += 1
            t0 = time.perf_counter()
            try:
                status, data = await conn.post("/v1/recommend", body)
                ok = status == 200
            except (OSError, asyncio.IncompleteReadError, ValueError):
                conn.close()
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t0)
                if reload_run is not None:
                    models.add(json.loads(data)["model"]["id"])
            else:
                errors += 1

    t0 = time.perf_counter()
    tasks = [worker(conn) for conn in conns]
    if reload_run is not None:
        tasks.append(_reload(base, reload_run))
    results = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    for conn in conns:
        conn.close()
    out = {"concurrency": concurrency, **_summary(latencies, errors, wall)}
    out["models_seen"] = len(models)
    if reload_run is not None:
        out["reload"] = results[-1]
    return out


def _summary(latencies: list[float], errors: int, wall: float) -> dict:
    """A closed-loop row: requests answered, errors, seconds, rate and latency percentiles."""
    return {
        "requests": len(latencies),
        "errors": errors,
        "seconds": round(wall, 2),
        "req_per_s": round(len(latencies) / wall, 1),
        "p50_ms": pct(latencies, 50),
        "p95_ms": pct(latencies, 95),
        "p99_ms": pct(latencies, 99),
    }


async def _reload(base: str, run: Path) -> dict:
    """After 1 s of load, a reload of `run` through the admin API: its status and seconds."""
    await asyncio.sleep(1.0)
    t = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        r = await client.post("/v1/admin/reload", json={"run": str(run)})
    return {"status": r.status_code, "seconds": round(time.perf_counter() - t, 2)}


async def overload(
    base: str, rate: float, duration: float, n_items: int, seed: int = 0, n_conns: int = 256
) -> dict:
    """Open-loop load: requests sent at `rate` per second whatever the answers (each on a
    keep-alive connection from a pool of `n_conns`, below the server's --limit-concurrency),
    while a separate connection probes /healthz every 20 ms. Served and refused requests and
    the probes are timed apart."""
    host, port = base.removeprefix("http://").split(":")
    bodies = _bodies(seed, n_items)
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(n_conns):
        pool.put_nowait(Connection(host, int(port)))
    served: list[float] = []
    refused: list[float] = []
    health: list[float] = []
    failed = 0
    t_end = time.perf_counter() + duration

    async def one(i: int) -> None:
        nonlocal failed
        conn = await pool.get()
        t0 = time.perf_counter()
        try:
            status, _ = await conn.post("/v1/recommend", bodies[i % len(bodies)])
        except (OSError, asyncio.IncompleteReadError, ValueError):
            conn.close()
            failed += 1
        else:
            elapsed = time.perf_counter() - t0
            if status == 200:
                served.append(elapsed)
            elif status == 503:
                refused.append(elapsed)
            else:
                failed += 1
        finally:
            pool.put_nowait(conn)

    prober = asyncio.ensure_future(_probe(Connection(host, int(port)), t_end, health))
    tasks, i, t0 = [], 0, time.perf_counter()
    while (now := time.perf_counter()) < t_end:
        due = int((now - t0) * rate)
        while i < due:
            tasks.append(asyncio.ensure_future(one(i)))
            i += 1
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    unhealthy = await prober
    wall = time.perf_counter() - t0

    return {
        "offered_per_s": round(i / wall, 1),
        "served": len(served),
        "served_per_s": round(len(served) / wall, 1),
        "served_p50_ms": pct(served, 50),
        "served_p99_ms": pct(served, 99),
        "refused_503": len(refused),
        "refused_p99_ms": pct(refused, 99),
        "failed": failed,
        "healthz_p99_ms": pct(health, 99),
        "healthz_probes": len(health),
        "healthz_not_200": unhealthy,
    }


async def _probe(conn: Connection, t_end: float, health: list[float]) -> int:
    """GET /healthz every 20 ms until `t_end`, each probe's seconds into `health`; how many
    did not answer 200."""
    unhealthy = 0
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        try:
            status, _ = await conn.post("/healthz", None)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            conn.close()
            status = 0
        health.append(time.perf_counter() - t0)
        unhealthy += status != 200
        await asyncio.sleep(0.02)
    conn.close()
    return unhealthy


def main_overload(a) -> int:
    """Capacity (closed loop, the most req/s over the concurrencies), then open-loop load at
    `--overload` x that rate on a server with a short queue."""
    with tempfile.TemporaryDirectory() as tmp:
        run = fresh_run(Path(tmp) / "a", a.items, "multvae", seed=0)
        with Server(run, a.batch_wait_ms, precision=a.precision) as server:
            caps = [
                asyncio.run(load(server.base, c, a.duration, a.max_requests, a.items))
                for c in a.concurrency
            ]
        cap = max(caps, key=lambda r: r["req_per_s"])
        extra = ["--max-queue", str(a.max_queue), "--request-timeout", str(a.request_timeout)]
        with Server(run, a.batch_wait_ms, precision=a.precision, extra=extra) as server:
            res = asyncio.run(
                overload(server.base, a.overload * cap["req_per_s"], a.duration, a.items)
            )
            alive = server.proc.poll() is None
    print(
        f"n_items {a.items}, --precision {a.precision}, history 50 items, k=100, "
        f"{a.duration:g} s per row, {os.cpu_count()} CPUs (client and server together); "
        f"overload server: --max-queue {a.max_queue} --request-timeout {a.request_timeout:g}\n"
    )
    print("| load | req/s served | p50 ms | p99 ms | 503s (p99 ms) | failed | /healthz p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(
        f"| capacity: closed loop, concurrency {cap['concurrency']} | {cap['req_per_s']} | "
        f"{cap['p50_ms']} | {cap['p99_ms']} | 0 | {cap['errors']} | |"
    )
    print(
        f"| {a.overload:g}x capacity: open loop, {res['offered_per_s']} req/s offered | "
        f"{res['served_per_s']} | {res['served_p50_ms']} | {res['served_p99_ms']} | "
        f"{res['refused_503']} ({res['refused_p99_ms']}) | {res['failed']} | "
        f"{res['healthz_p99_ms']} ({res['healthz_probes']} probes, "
        f"{res['healthz_not_200']} not 200) |"
    )
    print(f"\nserver alive after the overload: {alive}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell (5)")
    p.add_argument("--max-requests", type=int, default=20_000, help="requests per cell at most")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--batch-wait-ms", type=float, default=2.0, help="micro-batching wait (2)")
    p.add_argument("--items", type=int, default=ML20M_ITEMS, help="n_items (20,108: ML-20M)")
    p.add_argument("--precision", default="fp32", help="the server's --precision (fp32)")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    p.add_argument(
        "--modes",
        default="batched,unbatched,reload",
        help="which runs: micro-batching, no batching, micro-batching with a reload (all three)",
    )
    p.add_argument(
        "--overload",
        type=float,
        help="instead: measure capacity, then offer this many times it, open loop",
    )
    p.add_argument("--max-queue", type=int, default=64, help="the overloaded server's (64)")
    p.add_argument("--request-timeout", type=float, default=2.0, help="its deadline (2 s)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.overload:
        return main_overload(a)
    modes = set(a.modes.split(","))
    if modes - {"batched", "unbatched", "reload"}:
        p.error(f"unknown --modes {a.modes!r}: batched, unbatched, reload")
    rows, inproc = _runs(a, modes)
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    _print_table(a, rows, inproc)
    return 0


def _runs(a, modes: set) -> tuple[list[dict], dict]:
    """Each mode's rows, and the in-process batch-1 latency of the same model."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run_a = fresh_run(Path(tmp) / "a", a.items, "multvae", seed=0)
        run_b = fresh_run(Path(tmp) / "b", a.items, "multvae", seed=1)
        # the in-process batch-1 latency of the same model, for the concurrency-1 rows
        inproc = bench_infer(str(run_a), (1,), a.precision, seconds=a.duration, progress=False)[0]
        for mode, label, wait in (
            ("batched", "micro-batching", a.batch_wait_ms),
            ("unbatched", "no batching", 0.0),
        ):
            if mode not in modes:
                continue
            with Server(run_a, wait, precision=a.precision) as server:
                for c in a.concurrency:
                    res = asyncio.run(load(server.base, c, a.duration, a.max_requests, a.items))
                    rows.append({"mode": label, **res})
                    print(json.dumps(rows[-1]) if a.json else rows[-1], file=sys.stderr)
        if "reload" in modes:
            with Server(run_a, a.batch_wait_ms, precision=a.precision) as server:
                c = max(a.concurrency)  # long enough for the reload (seconds under load) and after
                dur = max(a.duration, 12.0)
                res = asyncio.run(
                    load(server.base, c, dur, a.max_requests, a.items, reload_run=run_b)
                )
                rows.append({"mode": "micro-batching + reload", **res})
    return rows, inproc


def _print_table(a, rows: list[dict], inproc: dict) -> None:
    print(
        f"n_items {a.items}, --precision {a.precision}, history 50 items, k=100, "
        f"{a.duration:g} s per row, "
        f"{os.cpu_count()} CPUs (client and server together)\n"
    )
    print(
        f"in process (`vaecf bench infer RUN --batch-size 1 --precision {a.precision}`): "
        f"p50 {inproc['p50_ms']:.2f} ms, p95 {inproc['p95_ms']:.2f} ms, "
        f"p99 {inproc['p99_ms']:.2f} ms\n"
    )
    print("| mode | concurrency | requests | req/s | p50 ms | p95 ms | p99 ms | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        note = ""
        if "reload" in r:
            rl = r["reload"]
            note = (
                f" (reload: HTTP {rl['status']} in {rl['seconds']} s; "
                f"{r['models_seen']} models answered)"
            )
        print(
            f"| {r['mode']}{note} | {r['concurrency']} | {r['requests']} | {r['req_per_s']} | "
            f"{r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['errors']} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
