"""serve(): load and check the model, then run the app on uvicorn until SIGTERM or SIGINT.

Start-up refuses (ConfigError, exit 2) before listening when the address is not loopback and
neither an API key nor --no-auth is given, and when the run does not load. SIGTERM (or SIGINT):
/readyz answers 503 for `shutdown_delay_s` while everything else is still served (a load
balancer sees not-ready before the server goes away), then uvicorn stops accepting, lets
requests in flight finish (up to `drain_s`), the app's lifespan scores what is queued and stops
its worker, and the process exits 0. A second signal skips the delay. SIGHUP reloads the model
(app.py). Connections that send their request's head or body too slowly are cut
(`head_timeout_s`, `body_timeout_s`: http_protocol), so that they cannot hold uvicorn's
`limit_concurrency` places.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import threading
from collections.abc import Callable

import uvicorn

from vaecf.config.serve import ServeSettings, check_auth


def serve(settings: ServeSettings, log_level: str = "info", access_log: bool = False) -> None:
    from vaecf.serve.app import create_app
    from vaecf.serve.reload import ModelHolder

    check_auth(settings)
    holder = ModelHolder.load(
        settings.run,
        settings.device,
        settings.precision,
        settings.reload_root,
        batch_sizes=(1, settings.max_batch_size),  # one request, a full micro-batch
    )
    app = create_app(holder, settings)
    logger = logging.getLogger("vaecf.serve")
    logger.setLevel(log_level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     vaecf: %(message)s"))
        logger.addHandler(handler)
    config = uvicorn_config(app, settings, log_level=log_level, access_log=access_log)
    choice = holder.current.recommender.precision_choice
    for line in choice.lines() if choice else ():
        print(line, flush=True)
    print(
        f"serving {holder.current.version['name']} from {holder.current.version['run']} on "
        f"http://{settings.host}:{settings.port}/ (the page; auth: "
        f"{'API key' if settings.api_key else 'none'}; the API's docs at /docs)",
        flush=True,
    )
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; note it
    # instead of dying by it, so that a SIGTERM'd server exits 0 after a clean shutdown
    stopped_by: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda s, _frame: stopped_by.append(s))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    # Everything loaded so far (torch, FastAPI, the model) lives as long as the process: move it
    # out of the cyclic collector's reach, whose full passes over it otherwise stall every
    # request in flight (under load at concurrency 64: p99 165 -> 51 ms, benchmarks/README.md)
    gc.collect()
    gc.freeze()
    try:
        DelayedExitServer(config, app.state.ready, settings.shutdown_delay_s, logger).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopped_by:
        logger.info("stopped by %s after a graceful shutdown", signal.Signals(stopped_by[0]).name)


def uvicorn_config(app, settings: ServeSettings, **overrides) -> uvicorn.Config:
    """The uvicorn configuration `vaecf serve` runs `app` with (the tests' servers too)."""
    kw = dict(
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=settings.drain_s,
        limit_concurrency=settings.limit_concurrency,
        server_header=False,
        access_log=False,
        http=http_protocol(settings.head_timeout_s, settings.body_timeout_s, _cut_counter(app)),
    )
    return uvicorn.Config(app, **{**kw, **overrides})


class DelayedExitServer(uvicorn.Server):
    """uvicorn's Server, whose first SIGTERM/SIGINT marks the app draining (/readyz 503) and
    starts the shutdown only `delay_s` later; a second signal starts it at once."""

    def __init__(self, config, ready: dict, delay_s: float, log):
        super().__init__(config)
        self.ready, self.delay_s, self.log = ready, delay_s, log
        self._timer: threading.Timer | None = None

    def handle_exit(self, sig, frame) -> None:
        if self._timer is not None or self.delay_s <= 0:
            return super().handle_exit(sig, frame)
        self.ready["draining"] = True
        name = signal.Signals(sig).name
        self.log.info("%s: /readyz now 503; draining in %g s", name, self.delay_s)
        self._timer = threading.Timer(self.delay_s, super().handle_exit, (sig, frame))
        self._timer.daemon = True
        self._timer.start()


class CoalescingTransport:
    """A transport that holds what one event-loop step writes and sends it in one write.
    uvicorn writes a response's status line and headers, then its body, each with a write of
    its own: two send(2) calls, and the first wakes the client, which then waits for the
    second. Held until the step ends, the two go out as one (measured in benchmarks/README.md,
    "What serving adds at concurrency 1"). Everything else is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop, self._held = transport, loop, []

    def write(self, data) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def flush(self) -> None:
        if self._held:
            data = b"".join(self._held)
            self._held.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name):
        return getattr(self._transport, name)


BODY_GRACE_S = 1.0  # a body still arriving this long past body_timeout_s: its connection is cut


def _cut_counter(app) -> Callable[[str], None] | None:
    """What counts a connection cut for its slowness, by reason: the app's refusals metric."""
    svc = getattr(getattr(app, "state", None), "svc", None)
    return None if svc is None else lambda reason: svc.metrics.rejected.labels(reason).inc()


def _timeout_answer(seconds: float) -> bytes:
    """The raw 408 a connection gets when its request's head does not arrive in time."""
    body = json.dumps(
        {
            "error": "head_timeout",
            "message": f"the request head did not arrive within head_timeout_s={seconds:g} s; "
            "send it at once",
            "limits": {"head_timeout_s": seconds},
        }
    ).encode()
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )


class SlowClientDeadlines:
    """http_protocol's deadlines, mixed into uvicorn's httptools protocol (before it in the
    MRO): the class attributes are the deadlines' seconds and the cut counter."""

    head_timeout_s: float | None = None
    body_timeout_s: float | None = None
    on_cut: Callable[[str], None] | None = None
    _deadline: asyncio.TimerHandle | None = None
    _begun = False  # a request's first byte came, and not yet its last

    def connection_made(self, transport) -> None:
        super().connection_made(CoalescingTransport(transport, self.loop))
        self._arm(self.head_timeout_s, "head_timeout")

    def connection_lost(self, exc) -> None:
        self._arm(None, "")
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        if self._deadline is None:  # a connection's first request: counted from its opening
            self._arm(self.head_timeout_s, "head_timeout")

    def on_headers_complete(self) -> None:
        self._arm(None, "")
        super().on_headers_complete()
        if self.body_timeout_s:
            self._arm(self.body_timeout_s + BODY_GRACE_S, "body_timeout")

    def on_message_complete(self) -> None:
        self._arm(None, "")
        self._begun = False
        super().on_message_complete()

    def _arm(self, seconds: float | None, reason: str) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(seconds, self._cut, reason) if seconds else None

    def _cut(self, reason: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.on_cut is not None:
            self.on_cut(reason)
        if reason == "head_timeout" and self._begun:
            self.transport.write(_timeout_answer(self.head_timeout_s))
        self.transport.close()


def http_protocol(
    head_timeout_s: float | None = None,
    body_timeout_s: float | None = None,
    on_cut: Callable[[str], None] | None = None,
):
    """uvicorn's httptools protocol with its writes coalesced (CoalescingTransport) and the
    slow-client deadlines uvicorn does not have: a request's head must arrive within
    `head_timeout_s` of its first byte (of the connection's opening, for its first request),
    else 408 and the connection is closed (closed without a word when nothing came); its body
    within `body_timeout_s` + BODY_GRACE_S of the head (the app answers 408 at `body_timeout_s`
    when it reads the body; this also cuts a body sent after an answer that did not read it).
    `on_cut(reason)` counts each cut ("head_timeout", "body_timeout"). "auto" (uvicorn's
    choice, without these deadlines) where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn without its [standard] extra
        return "auto"

    limits = {
        "head_timeout_s": head_timeout_s,
        "body_timeout_s": body_timeout_s,
        "on_cut": None if on_cut is None else staticmethod(on_cut),
    }
    return type("VaecfHttpProtocol", (SlowClientDeadlines, HttpToolsProtocol), limits)
