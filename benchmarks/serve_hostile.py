"""Hostile load on `vaecf serve`, then a SIGKILL drill: does it stay healthy, and lose nothing?

Recommendation clients beside a flood of similar-items requests (k=1000, no back-off on 503) and
connections dripping request heads (a header line every `--drip` seconds, reopened when cut), a
/healthz probe every 20 ms throughout; after `--duration` seconds measured, a SIGKILL at a random
moment of the next half second while the load goes on. Prints each kind's sent, 200, 503 and
other answers with p50/p99, the dripping connections cut (and with a 408), issue 39's two goals
(/healthz p99 < 100 ms, recommend p99 < 1 s), and whether the run directory is unchanged and a
restarted server answers as before (exit status 1 if either is not).

The server, the client's connections and the model (untrained Mult-VAE, ML-20M's size unless
`--items`) are serve_load.py's: serve_client.py has the server and the client.

    python benchmarks/serve_hostile.py --items 40000 --duration 10   # issue 39's goals
    python benchmarks/serve_hostile.py --items 200 --duration 0.3 --flood 1 --slow-heads 1 \
        --recommenders 1 --drip 0.1 --head-timeout 0.2                # a smoke run
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
import tempfile
import time
from pathlib import Path

import httpx
from serve_client import ML20M_ITEMS, Connection, Server, pct

from vaecf.serve.fixtures import fresh_run


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
        return (f"| {what} | {n} | {st[200]} | {st[503]} | {other} | {pct(times, 50, 1)} | "
                f"{pct(times, 99, 1)} |")  # fmt: skip


class Hostile:
    """The clients of one run against 127.0.0.1:`port`; what each saw while the
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
            except TimeoutError:
                writer.write(b"X-Drip-%d: 1\r\n" % i)
                i += 1
        return None


async def hostile(port: int, a, kill) -> dict:
    """The load of one run: `a.duration` seconds measured, then `kill()` at a random
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
        "recommend_p99_ms": pct(t["recommend"].ok, 99, 1),
        "healthz_p99_ms": pct(t["healthz"].all, 99, 1),
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
    """The load and the kill drill, on one server; a second server checks what the
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
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured (5)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0, help="micro-batching wait (2)")
    p.add_argument("--items", type=int, default=ML20M_ITEMS, help="n_items (20,108: ML-20M)")
    p.add_argument("--precision", default="fp32", help="the server's --precision (fp32)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    p.add_argument("--flood", type=int, default=150, help="similar-items connections (150)")
    p.add_argument("--recommenders", type=int, default=6, help="recommend clients (6)")
    p.add_argument("--slow-heads", type=int, default=16, help="dripping connections (16)")
    p.add_argument("--drip", type=float, default=1.0, help="seconds between header lines (1)")
    p.add_argument("--head-timeout", type=float, help="the server's (unset: its default)")
    return main_hostile(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
