"""The server and the client the serving benchmarks share (serve_load.py, serve_hostile.py).

`Server`: a real `vaecf serve` subprocess on 127.0.0.1, ready when /readyz answers 200.
`pct`: a percentile of latencies in ms.
`Connection`: one keep-alive HTTP/1.1 connection that speaks only what the load needs, so that
the client's own CPU use, on the cores it shares with the server, stays small.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ML20M_ITEMS = 20_108  # the catalogue the benchmarks serve unless told otherwise (ML-20M's)


def pct(xs: list[float], p: int, digits: int = 2) -> float | None:
    """The p-th percentile of `xs` seconds, in ms rounded to `digits` (None under two values)."""
    if len(xs) < 2:
        return None
    return round(statistics.quantiles(xs, n=100, method="inclusive")[p - 1] * 1e3, digits)


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
