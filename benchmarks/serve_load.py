"""Load test of `vaecf serve`: requests/s and latency percentiles of POST /v1/recommend.

At several concurrencies, with and without micro-batching, and one run during which the model
is reloaded (`--modes` picks among the three). `--overload` offers a multiple of the measured
capacity, open loop; `--hostile` runs recommendation clients beside a flood of similar-items
requests (k=1000, no back-off on 503) and connections dripping request heads, probes /healthz
throughout, then SIGKILLs the server during that load and checks that nothing was lost (the
run directory unchanged, a restarted server answering as before).

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
    python benchmarks/serve_load.py --hostile --items 40000 --duration 10   # issue 39's goals
    python benchmarks/serve_load.py --hostile --items 200 --duration 1 --flood 4 --slow-heads 2 \
        --recommenders 2 --drip 0.2 --head-timeout 0.5                       # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from vaecf.bench import bench_infer
from vaecf.serve.fixtures import fresh_run

ML20M_ITEMS = 20_108


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vaecf serve RUN` as a subprocess, ready when /readyz answers 200."""

    def __init__(
        self,
        run: Path,
        batch_wait_ms: float,
        max_batch_size: int = 256,
        precision: str = "fp32",
        extra: list[str] | None = None,
    ):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "vaecf", "serve", str(run), "--port", str(self.port)]
        cmd += ["--batch-wait-ms", str(batch_wait_ms), "--max-batch-size", str(max_batch_size)]
        cmd += ["--precision", precision, "--log-level", "warning", *(extra or [])]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"vaecf serve exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise SystemExit("vaecf serve did not become ready in 120 s")

    def kill(self) -> None:
        """SIGKILL: no drain, no clean-up (what a crash or an OOM kill does)."""
        self.proc.kill()
        self.proc.wait(30)

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just what this load needs: POST a JSON body,
    read the status line, the headers and a Content-Length body. Far lighter than a general
    client, so that the client's own CPU use, on the cores it shares with the server, stays
    small."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes | None) -> tuple[int, bytes]:
        """POST `body` (JSON) to `path`, or GET it when `body` is None."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{'GET' if body is None else 'POST'} {path} HTTP/1.1\r\n"
        head += f"Host: {self.host}:{self.port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        head += "\r\n"
        body = body or b""
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length, close = None, False
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        if length is None:
            raise ConnectionError("response without Content-Length")
        data = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def load(
    base: str,
    concurrency: int,
    duration: float,
    max_requests: int,
    n_items: int,
    reload_run: Path | None = None,
    seed: int = 0,
) -> dict:
    rng = random.Random(seed)
    host, port = base.removeprefix("http://").split(":")
    bodies = [  # made before the clock starts: 1,000 different histories of 50 items
        json.dumps({"items": rng.sample(range(n_items), 50), "k": 100}).encode()
        for _ in range(1000)
    ]
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

    async def reloader() -> dict:
        await asyncio.sleep(1.0)
        t = time.perf_counter()
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            r = await client.post("/v1/admin/reload", json={"run": str(reload_run)})
        return {"status": r.status_code, "seconds": round(time.perf_counter() - t, 2)}

    t0 = time.perf_counter()
    tasks = [worker(conn) for conn in conns]
    if reload_run is not None:
        tasks.append(reloader())
    results = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    for conn in conns:
        conn.close()
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else []
    out = {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors,
        "seconds": round(wall, 2),
        "req_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(q[49] * 1e3, 2) if q else None,
        "p95_ms": round(q[94] * 1e3, 2) if q else None,
        "p99_ms": round(q[98] * 1e3, 2) if q else None,
        "models_seen": len(models),
    }
    if reload_run is not None:
        out["reload"] = results[-1]
    return out


async def overload(
    base: str, rate: float, duration: float, n_items: int, seed: int = 0, n_conns: int = 256
) -> dict:
    """Open-loop load: requests sent at `rate` per second whatever the answers (each on a
    keep-alive connection from a pool of `n_conns`, below the server's --limit-concurrency),
    while a separate connection probes /healthz every 20 ms. Served and refused requests and
    the probes are timed apart."""
    rng = random.Random(seed)
    host, port = base.removeprefix("http://").split(":")
    bodies = [
        json.dumps({"items": rng.sample(range(n_items), 50), "k": 100}).encode()
        for _ in range(1000)
    ]
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(n_conns):
        pool.put_nowait(Connection(host, int(port)))
    served, refused, health = [], [], []
    failed = unhealthy = 0
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

    async def probe() -> None:
        nonlocal unhealthy
        conn = Connection(host, int(port))
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

    prober = asyncio.ensure_future(probe())
    tasks, i, t0 = [], 0, time.perf_counter()
    while (now := time.perf_counter()) < t_end:
        due = int((now - t0) * rate)
        while i < due:
            tasks.append(asyncio.ensure_future(one(i)))
            i += 1
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks, prober)
    wall = time.perf_counter() - t0

    def pct(xs: list[float], p: int) -> float | None:
        if len(xs) < 2:
            return None
        return round(statistics.quantiles(xs, n=100, method="inclusive")[p - 1] * 1e3, 2)

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


# -- --hostile: recommendations beside a similar-items flood and slow heads, then a kill -------
class Tally:
    """Statuses (0: no answer) and the seconds of 200 answers, of one kind of request."""

    def __init__(self) -> None:
        self.statuses: collections.Counter = collections.Counter()
        self.ok: list[float] = []
        self.all: list[float] = []

    def add(self, status: int, seconds: float) -> None:
        self.statuses[status] += 1
        self.all.append(seconds)
        if status == 200:
            self.ok.append(seconds)

    def row(self, what: str, times: list[float]) -> str:
        n, st = sum(self.statuses.values()), self.statuses
        other = n - st[200] - st[503]
        return (f"| {what} | {n} | {st[200]} | {st[503]} | {other} | {pct(times, 50)} | "
                f"{pct(times, 99)} |")  # fmt: skip


def pct(xs: list[float], p: int) -> float | None:
    """The p-th percentile of `xs` in ms (None for fewer than 2)."""
    if len(xs) < 2:
        return None
    return round(statistics.quantiles(xs, n=100, method="inclusive")[p - 1] * 1e3, 1)


class Hostile:
    """The clients of one --hostile run against 127.0.0.1:`port`; what each saw while the
    clock ran (`until`), and nothing after the kill."""

    def __init__(self, port: int, a, until: float):
        self.host, self.port, self.a, self.until = "127.0.0.1", port, a, until
        self.killed = False
        self.tallies = {k: Tally() for k in ("recommend", "similar", "healthz")}
        self.cuts: list[float] = []  # seconds from a dripping connection's opening to its cut
        self.cut_408 = 0

    def measuring(self, t0: float) -> bool:
        return not self.killed and t0 < self.until

    async def loop(self, kind: str, request, pause: float = 0.0) -> None:
        """One keep-alive connection sending `request(i)` -> (path, body), one at a time."""
        conn, i = Connection(self.host, self.port), 0
        while not self.killed:
            path, body = request(i)
            t0 = time.perf_counter()
            try:
                status, _ = await conn.post(path, body)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                conn.close()
                status = 0
            if self.measuring(t0):
                self.tallies[kind].add(status, time.perf_counter() - t0)
            i += 1
            await asyncio.sleep(pause)
        conn.close()

    async def drip(self) -> None:
        """A connection that sends its request head a header line every --drip seconds;
        opened again at once when the server cuts it."""
        while not self.killed:
            t0 = time.perf_counter()
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            try:
                reply = await self.dripping(reader, writer)
            except OSError:
                reply = b""
            finally:
                writer.close()
            if reply is not None and self.measuring(t0):
                self.cuts.append(time.perf_counter() - t0)
                self.cut_408 += reply.startswith(b"HTTP/1.1 408")

    async def dripping(self, reader, writer) -> bytes | None:
        """What the server sent before it closed (None: the run ended first)."""
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: {self.host}\r\n".encode())
        i = 0
        while not self.killed:
            try:
                return await asyncio.wait_for(reader.read(4096), self.a.drip)
            except asyncio.TimeoutError:
                writer.write(b"X-Drip-%d: 1\r\n" % i)
                i += 1
        return None


async def hostile(port: int, a, kill) -> dict:
    """The load of one --hostile run: `a.duration` seconds measured, then `kill()` at a random
    moment of the next half second while the load goes on."""
    rng = random.Random(0)
    bodies = [json.dumps({"items": rng.sample(range(a.items), 50), "k": 100}).encode()
              for _ in range(1000)]  # fmt: skip
    h = Hostile(port, a, time.perf_counter() + a.duration)
    tasks = [asyncio.ensure_future(h.loop("healthz", lambda i: ("/healthz", None), 0.02))]
    tasks += [asyncio.ensure_future(h.loop(
        "similar", lambda i, j=j: (f"/v1/items/{(i * 7919 + j) % a.items}/similar?k=1000", None)))
        for j in range(a.flood)]  # fmt: skip
    tasks += [asyncio.ensure_future(h.drip()) for _ in range(a.slow_heads)]
    tasks += [asyncio.ensure_future(h.loop(
        "recommend", lambda i, j=j: ("/v1/recommend", bodies[(i * 31 + j) % len(bodies)])))
        for j in range(a.recommenders)]  # fmt: skip
    await asyncio.sleep(a.duration + rng.uniform(0.0, 0.5))
    kill()
    h.killed = True
    await asyncio.wait(tasks, timeout=30)
    t = h.tallies
    return {
        "recommend": t["recommend"].row(f"POST /v1/recommend ({a.recommenders} clients, "
                                        "history 50, k=100)", t["recommend"].ok),
        "similar": t["similar"].row(f"similar-items flood ({a.flood} connections, k=1000)",
                                    t["similar"].ok),
        "healthz": t["healthz"].row("/healthz every 20 ms (every answer)", t["healthz"].all),
        "recommend_p99_ms": pct(t["recommend"].ok, 99),
        "healthz_p99_ms": pct(t["healthz"].all, 99),
        "healthz_not_200": sum(n for s, n in t["healthz"].statuses.items() if s != 200),
        "cuts": len(h.cuts),
        "cuts_408": h.cut_408,
        "cut_after_s": (round(statistics.median(h.cuts), 2), round(max(h.cuts), 2))
        if h.cuts else None,
    }  # fmt: skip


def digest(root: Path) -> dict:
    """Every entry under `root`: a file's sha256, or 'dir'."""
    return {str(p): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}  # fmt: skip


def answers(base: str) -> tuple:
    """What a restarted server must answer as before: /readyz and one recommendation, without
    the moment the model was loaded."""
    ready = httpx.get(f"{base}/readyz", timeout=10).json()
    rec = httpx.post(f"{base}/v1/recommend", json={"items": [1, 2, 3], "k": 10}, timeout=10)
    body = rec.json()
    for d in (ready, body):
        d.get("model", {}).pop("loaded_at", None)
    return ready, rec.status_code, body


def main_hostile(a) -> int:
    """--hostile: the load and the kill drill, on one server; a second server checks what the
    kill left behind."""
    extra = [] if a.head_timeout is None else ["--head-timeout", str(a.head_timeout)]
    with tempfile.TemporaryDirectory() as tmp:
        run = fresh_run(Path(tmp) / "a", a.items, "multvae", seed=0)
        before = digest(run)
        with Server(run, a.batch_wait_ms, precision=a.precision, extra=extra) as server:
            expected = answers(server.base)
            res = asyncio.run(hostile(server.port, a, server.kill))
        unchanged = digest(run) == before
        with Server(run, a.batch_wait_ms, precision=a.precision, extra=extra) as server:
            same = answers(server.base) == expected
    if a.json:
        print(json.dumps({**res, "run_unchanged": unchanged, "restart_same": same}))
        return 0 if unchanged and same else 1
    print(
        f"n_items {a.items}, --precision {a.precision}, {a.duration:g} s measured, "
        f"{os.cpu_count()} CPUs (client and server together); the server's defaults"
        f"{'' if a.head_timeout is None else f' but --head-timeout {a.head_timeout:g}'}; "
        f"{a.slow_heads} connections dripping a request head "
        f"(a header line every {a.drip:g} s, reopened when cut) throughout\n"
    )
    print("| requests | sent | 200 | 503 | other | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for key in ("recommend", "similar", "healthz"):
        print(res[key])
    cut = res["cut_after_s"]
    print(f"\ndripping heads cut: {res['cuts']} ({res['cuts_408']} with a 408), after "
          f"{cut[0] if cut else '-'} s (median), {cut[1] if cut else '-'} s (max)")  # fmt: skip
    hp, rp = res["healthz_p99_ms"], res["recommend_p99_ms"]
    print(f"goals: /healthz p99 < 100 ms: {hp is not None and hp < 100} ({hp} ms, "
          f"{res['healthz_not_200']} not 200); recommend p99 < 1 s: "
          f"{rp is not None and rp < 1000} ({rp} ms)")  # fmt: skip
    print(
        f"kill drill (SIGKILL during the load): run directory unchanged: {unchanged}; "
        f"a restarted server answers as before: {same}"
    )
    return 0 if unchanged and same else 1


def main(argv: list[str] | None = None) -> int:
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
    p.add_argument(
        "--hostile",
        action="store_true",
        help="instead: recommendations beside a similar-items flood and dripping heads, then a "
        "SIGKILL during that load (--duration measured)",
    )
    p.add_argument("--flood", type=int, default=150, help="similar-items connections (150)")
    p.add_argument("--recommenders", type=int, default=6, help="recommend clients (6)")
    p.add_argument("--slow-heads", type=int, default=16, help="dripping connections (16)")
    p.add_argument("--drip", type=float, default=1.0, help="seconds between header lines (1)")
    p.add_argument("--head-timeout", type=float, help="the server's (unset: its default)")
    a = p.parse_args(argv)
    if a.overload:
        return main_overload(a)
    if a.hostile:
        return main_hostile(a)

    modes = set(a.modes.split(","))
    if modes - {"batched", "unbatched", "reload"}:
        p.error(f"unknown --modes {a.modes!r}: batched, unbatched, reload")
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
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return 0
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
