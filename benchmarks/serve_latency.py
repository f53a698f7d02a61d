"""What serving adds at concurrency 1: against the in-process call and a bare framework route.

The p50/p99 latency of `Recommender.recommend` in process against `POST /v1/recommend` of a
real `vaecf serve` subprocess over one keep-alive connection, for the same model, precision,
histories and k, measured in alternating rounds in one run (this machine is shared and noisy).
The third side, the framework's floor: a bare FastAPI route on the same uvicorn (uvloop and
httptools, as `vaecf serve` runs), validating the same body with a pydantic model and returning
the bytes `vaecf serve` answered for it, without scoring (`BARE`, a subprocess). The fourth,
the floor of a server that scores nothing on its event loop: the same bare route handing the
same `recommend_batch` call to one worker thread (the model loaded there) and awaiting it. What
vaecf's own layers add: served - (bare + in process); of that, the worker thread's hop is
floor - (bare + in process), and the rest, served - floor, is vaecf's beyond what any such
server pays.

The model is an untrained Mult-VAE (the paper's [600] hidden layer, 200-d latent) of
ml-latest-small's size (6,946 items after the paper's preparation); random weights cost what
trained ones do. Histories: 10 random items; k = 10. The client is a minimal HTTP/1.1 client on
a raw socket (an HTTP library would add its own cost to the served side).

    python benchmarks/serve_latency.py                    # 10 rounds x 500 requests per side
    python benchmarks/serve_latency.py --items 20108 --precision bf16 --rounds 5
    VAECF_HOME=$(mktemp -d) python benchmarks/serve_latency.py --precision auto   # timed afresh
    python benchmarks/serve_latency.py --items 100 --requests 5 --rounds 1 --warmup 5   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vaecf.bench.hardware import cpu_name
from vaecf.recommender import Recommender
from vaecf.serve.fixtures import fresh_run

BARE = """
import asyncio, sys
from concurrent.futures import ThreadPoolExecutor
import uvicorn
from fastapi import FastAPI, Response
from pydantic import BaseModel, Field

class Body(BaseModel):
    items: list[int | str] = Field(max_length=10_000)
    k: int = Field(10, ge=1, le=1000)

answer = open(sys.argv[2], "rb").read()
app = FastAPI()
if len(sys.argv) > 3:  # the floor: the same scoring call on one worker thread, loaded there
    from vaecf.recommender import Recommender
    worker = ThreadPoolExecutor(1)
    rec = worker.submit(Recommender.load, sys.argv[3], precision=sys.argv[4]).result()

    def score(items, k):
        return rec.recommend_batch([items], k)

    @app.post("/v1/recommend")
    async def recommend(body: Body) -> Response:
        await asyncio.get_running_loop().run_in_executor(worker, score, body.items, body.k)
        return Response(answer, media_type="application/json")
else:
    @app.post("/v1/recommend")
    async def recommend(body: Body) -> Response:
        return Response(answer, media_type="application/json")

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            log_level="warning", access_log=False)
"""


class Client:
    """One keep-alive HTTP/1.1 connection; `post` returns the status and the body."""

    def __init__(self, port: int):
        self.port, self.sock = port, None
        self.connect()

    def connect(self) -> None:
        """A fresh connection (the last closed): a server closes one left idle past its
        keep-alive timeout, as a side's connection is while the others take their turn."""
        if self.sock is not None:
            self.sock.close()
        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection mid-answer")
        self.buf += data

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)
        while b"\r\n\r\n" not in self.buf:
            self._read()
        header, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = header.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, _, v in (h.partition(b":") for h in lines[1:])
                      if k.strip().lower() == b"content-length")  # fmt: skip
        while len(self.buf) < length:
            self._read()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, body

    def close(self) -> None:
        self.sock.close()


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vaecf serve exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                if b" 200 " in s.recv(4096):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("vaecf serve did not become ready")


def percentiles(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


SIDES = (  # (key, label)
    ("in_process", "in process: Recommender.recommend"),
    ("served", "served: POST /v1/recommend, concurrency 1"),
    ("bare", "bare route: FastAPI + pydantic, the same bytes, no scoring"),
    ("floor", "bare route + the same scoring call on one worker thread"),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=6946, help="n_items (6,946: ml-latest-small)")
    p.add_argument("--history", type=int, default=10, help="items per history (10)")
    p.add_argument("-k", type=int, default=10, help="items asked for (10)")
    p.add_argument("--precision", default="fp32", help="serving precision (fp32)")
    p.add_argument("--requests", type=int, default=500, help="requests per side per round")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds (10)")
    p.add_argument("--warmup", type=int, default=200, help="untimed requests per side (200)")
    p.add_argument("--server-args", default="", help="extra `vaecf serve` options")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = p.parse_args(argv)

    rng = random.Random(0)
    histories = [rng.sample(range(a.items), a.history) for _ in range(1000)]
    bodies = [json.dumps({"items": h, "k": a.k}).encode() for h in histories]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}
    env = {k: v for k, v in env.items() if v != ""}
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        run = fresh_run(Path(tmp) / "run", a.items, "multvae")
        rec = Recommender.load(run, precision=a.precision)
        try:
            port = free_port()
            cmd = [sys.executable, "-m", "vaecf", "serve", str(run), "--port", str(port),
                   "--precision", a.precision, *a.server_args.split()]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          env=env))  # fmt: skip
            wait_ready(port, procs[0])
            clients = {"served": Client(port)}
            answer = Path(tmp) / "answer.json"
            answer.write_bytes(clients["served"].post("/v1/recommend", bodies[0])[1])
            for side, extra in (("bare", []), ("floor", [str(run), a.precision])):
                proc, side_port = _bare(answer, env, extra)
                procs.append(proc)
                clients[side] = Client(side_port)
            times = _rounds(a, rec, clients, histories, bodies)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    res = {"cpu": cpu_name(), "cores": os.cpu_count(), "items": a.items, "precision": a.precision}
    choice = rec.precision_choice  # with auto: what it chose (each side loads the same choice)
    res["precision_choice"] = choice.to_dict() if choice else None
    res.update({side: percentiles(times[side]) for side, _ in SIDES})
    for q in ("p50", "p99"):
        ms = {side: res[side][f"{q}_ms"] for side, _ in SIDES}
        res[f"added_{q}_ms"] = ms["served"] - ms["in_process"]
        res[f"own_{q}_ms"] = res[f"added_{q}_ms"] - ms["bare"]
        res[f"hop_{q}_ms"] = ms["floor"] - ms["bare"] - ms["in_process"]
        res[f"beyond_floor_{q}_ms"] = ms["served"] - ms["floor"]
    if a.json:
        print(json.dumps(res))
    else:
        table(a, res, choice)
    return 0


def table(a, res: dict, choice) -> None:
    print(
        f"{res['cpu']}, {res['cores']} CPUs; Mult-VAE over {a.items} items, {a.precision}, "
        f"history {a.history}, k={a.k}; {a.rounds} x {a.requests} requests per side\n"
    )
    for line in [*choice.lines(), ""] if choice else ():  # --precision auto: its choice, from what
        print(line)
    print("| | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for key, label in SIDES:
        print(f"| {label} | {res[key]['p50_ms']:.3f} | {res[key]['p99_ms']:.3f} |")
    rows = (("added by serving: served - in process", "added"),
            ("vaecf's own layers: served - (bare + in process)", "own"),
            ("of which the worker thread's hop: floor - (bare + in process)", "hop"),
            ("vaecf's layers beyond that floor: served - floor", "beyond_floor"))  # fmt: skip
    for label, key in rows:
        print(f"| {label} | {res[f'{key}_p50_ms']:+.3f} | {res[f'{key}_p99_ms']:+.3f} |")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bare(answer: Path, env: dict, extra: list[str]) -> tuple[subprocess.Popen, int]:
    """The bare route's server (`BARE`) answering `answer`'s bytes (with `extra`, RUN and
    PRECISION: after scoring on a worker thread), ready; and its port."""
    port = free_port()
    cmd = [sys.executable, "-c", BARE, str(port), str(answer), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            client = Client(port)
            client.post("/v1/recommend", b'{"items": [1], "k": 1}')
            client.close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the bare route's server exited: {proc.returncode}") from None
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("the bare route's server did not start")


def _rounds(a, rec, clients: dict, histories: list, bodies: list) -> dict[str, list]:
    """Milliseconds of each answer by side: every side warmed, then `a.rounds` rounds of
    `a.requests` answers a side."""
    times = {side: [] for side, _ in SIDES}
    for c in clients.values():  # fresh: the first ones waited while the later servers started
        c.connect()
    for i in range(a.warmup):  # warm every side
        for c in clients.values():
            c.post("/v1/recommend", bodies[i % len(bodies)])
        rec.recommend(histories[i % len(histories)], k=a.k)
    # rounds of each side in turn, so that all see the machine's noise alike (not one call
    # of each in turn: the other processes' busy-waiting threads would slow it)
    for _ in range(a.rounds):
        for i in range(a.requests):
            h = histories[i % len(histories)]
            t0 = time.perf_counter()
            rec.recommend(h, k=a.k)
            times["in_process"].append((time.perf_counter() - t0) * 1e3)
        for side, c in clients.items():
            c.connect()  # untimed: a new connection and its first answer
            c.post("/v1/recommend", bodies[0])
            for i in range(a.requests):
                t0 = time.perf_counter()
                status, _ = c.post("/v1/recommend", bodies[i % len(bodies)])
                times[side].append((time.perf_counter() - t0) * 1e3)
                if status != 200:
                    raise RuntimeError(f"the {side} side answered {status}")
    for c in clients.values():
        c.close()
    return times


if __name__ == "__main__":
    raise SystemExit(main())
