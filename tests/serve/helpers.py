"""Test helpers for the server: run an app on uvicorn in a thread, on 127.0.0.1 and a free port;
hold a recommender's calls on demand (Gate)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import TYPE_CHECKING

import httpx
import uvicorn

from vaecf.config.serve import ServeSettings
from vaecf.serve.app import create_app
from vaecf.serve.reload import ModelHolder
from vaecf.serve.server import uvicorn_config

if TYPE_CHECKING:
    from vaecf.recommender import Recommender


def fuzz_target(root, ids: list, max_body_bytes: int) -> ServeSettings:
    """What the fuzz tests serve: a tiny untrained Mult-VAE over raw ids `ids` in ROOT/run, with
    small limits (history 20, k 30, batch 4) so that generated requests hit them."""
    from vaecf.serve.fixtures import fresh_run

    run = fresh_run(root / "run", len(ids), "multvae", {"hidden_dims": [8], "latent_dim": 4}, ids)
    return ServeSettings(
        run=str(run), max_history=20, max_k=30, max_batch=4, max_body_bytes=max_body_bytes
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(settings: ServeSettings, holder: ModelHolder | None = None):
    """(base url, app) of a real uvicorn server in a thread, for the duration of the block."""
    holder = holder or ModelHolder.load(settings.run, root=settings.reload_root)
    app = create_app(holder, settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, settings, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def client(base: str, **kw) -> httpx.Client:
    return httpx.Client(base_url=base, **{"timeout": 30, **kw})


class Gate:
    """Holds every call of a recommender's `method` until opened (a slow machine, on demand);
    `calls` records each call's first argument's length (histories scored)."""

    def __init__(self, rec: Recommender, method: str = "recommend_batch"):
        self.open, self.entered, self.calls = threading.Event(), threading.Event(), []
        inner = getattr(rec, method)

        def gated(first, *args, **kw):
            self.entered.set()
            self.open.wait(30)
            self.calls.append(len(first) if isinstance(first, list) else 1)
            return inner(first, *args, **kw)

        setattr(rec, method, gated)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.open.set()  # never leave a scoring thread held, whatever the test did
