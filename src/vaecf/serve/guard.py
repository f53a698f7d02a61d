"""Guard: the one ASGI middleware, around every HTTP request. What applies before any route is
declared here and nowhere else: the Host name (421), the API and admin keys (401, 403, 415), the
scoring queues' room (503 with Retry-After, before the body is read), the body size limit (413)
and the body's deadline (408: body_timeout_s from the request's start); then the metrics of every
answer, and the rule that no traceback reaches a client (an unexpected error is logged and
answered with a generic JSON 500). The key is compared, never logged or counted."""

import asyncio
import logging
import secrets
import time

from fastapi.responses import JSONResponse

from vaecf.config.serve import ServeSettings, host_name
from vaecf.serve.batcher import client_gone
from vaecf.serve.page import PAGE_PATHS
from vaecf.serve.prometheus import Metrics
from vaecf.serve.schemas import error
from vaecf.serve.service import CLIENT_CLOSED, busy

log = logging.getLogger("vaecf.serve")

UNAUTHENTICATED = ("/healthz", *PAGE_PATHS)  # the page is a shell: its data calls need the key
# answered whatever the Host header names (/readyz names no model to a foreign one: ops.py)
PROBES = ("/healthz", "/readyz")
ADMIN = "/v1/admin/"
SCORING = ("/v1/recommend", "/v1/recommend/batch")


def reads_model(path: str) -> bool:
    """Whether `path` is a route whose work waits in the scoring worker's call queue."""
    return (
        path == "/v1/items"
        or (path.startswith("/v1/items/") and path.endswith("/similar"))
        or (path.startswith("/v1/users/") and path.endswith("/recommend"))
    )


class Guard:
    def __init__(self, app, settings: ServeSettings, metrics: Metrics, active: dict, full):
        self.app = app
        # full(), full(calls=True): whether the scoring queue (the call queue) is full; the
        # requests that would wait there are refused unread
        self.full = full
        self.active = active  # {"n": HTTP requests in progress}, read by the batcher
        self.key = settings.api_key.encode() if settings.api_key else None
        self.admin_key = settings.admin_key.encode() if settings.admin_key else None
        self.admin_open = settings.admin_open()
        self.hosts = settings.host_names()
        self.max_body = settings.max_body_bytes
        self.body_timeout = settings.body_timeout_s
        self.metrics = metrics

    @staticmethod
    def _authorized(headers: dict[bytes, bytes], key: bytes) -> bool:
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given is not None and secrets.compare_digest(given, key)

    def _host_allowed(self, headers: dict[bytes, bytes]) -> bool:
        """The Host header names this server (DNS rebinding: a page on attacker.example that
        resolves to 127.0.0.1 still sends Host: attacker.example)."""
        if self.hosts is None:
            return True
        return host_name(headers.get(b"host", b"").decode("latin-1")) in self.hosts

    def _refusal(self, scope, headers) -> JSONResponse | None:
        """The answer to a request refused before routing (host, credentials), or None."""
        path = scope["path"]
        # the probes carry no action: an orchestrator's health check sends Host: POD_IP:PORT
        if path not in PROBES and not self._host_allowed(headers):
            return error(
                421,
                "host_not_allowed",
                "this server does not answer to that Host name; start it with "
                "--allowed-host NAME to add one",
            )
        if path.startswith(ADMIN):
            if self.admin_key is not None:
                if not self._authorized(headers, self.admin_key):
                    return _unauthorized("the admin key (--admin-key-file)")
                return None
            if not self.admin_open:
                return error(
                    403,
                    "admin_disabled",
                    "admin routes need --admin-key-file on a server that is not loopback-only",
                )
            if scope["method"] == "POST" and _content_type(headers) != b"application/json":
                # a web page can make a browser send text/plain without asking; JSON it cannot
                return error(
                    415,
                    "unsupported_media_type",
                    "send admin requests with Content-Type: application/json",
                )
        if self.key is not None and path not in UNAUTHENTICATED:
            if not self._authorized(headers, self.key):
                return _unauthorized("the API key")
        if path in SCORING and self.full():  # overloaded: refused before any parsing
            msg = "the scoring queue is full (max_queue); retry shortly"
            return busy(self.metrics, "overloaded", msg)
        if reads_model(path) and self.full(calls=True):
            msg = "the scoring worker's call queue is full (max_call_queue); retry shortly"
            return busy(self.metrics, "overloaded", msg)
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        state = {"status": 500, "started": False}
        self.active["n"] += 1

        async def send_wrapped(message):
            if message["type"] == "http.response.start":
                state["status"], state["started"] = message["status"], True
            await send(message)

        try:
            await self._handle(scope, receive, send_wrapped, state)
        except Exception:
            log.exception("unhandled error in %s %s", scope["method"], scope["path"])
            if not state["started"]:
                resp = error(500, "internal", "internal server error; the server log says more")
                await resp(scope, receive, send_wrapped)
        finally:
            self.active["n"] -= 1
            label = getattr(scope.get("route"), "path", None) or "(not routed)"
            self.metrics.observe_request(label, state["status"], time.perf_counter() - t0)

    async def _handle(self, scope, receive, send, state):
        headers = dict(scope["headers"])
        refused = self._refusal(scope, headers)
        if refused is not None:
            return await refused(scope, receive, send)
        # what waits (for the scoring queue or thread) watches the connection meanwhile: a
        # client that leaves gives up its request (and its place in the queue) instead of
        # having its histories scored for nobody; the answer's status is then 499
        client_gone.set(lambda: _disconnected(receive))
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return await self._too_large(scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS") and length is None:
            return await self.app(scope, receive, send)
        # buffer the body (at most max_body bytes, within body_timeout_s), then replay it
        try:
            async with asyncio.timeout(self.body_timeout):  # no task, unlike wait_for
                chunks = await self._body(receive)
        except TimeoutError:
            return await self._too_slow(scope, receive, send)
        if chunks is None:
            state["status"] = CLIENT_CLOSED
            return
        if isinstance(chunks, int):
            return await self._too_large(scope, receive, send)
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay():
            nonlocal body
            if body is None:
                return await receive()
            message, body = body, None
            return message

        await self.app(scope, replay, send)

    async def _body(self, receive) -> list[bytes] | int | None:
        """The body's chunks; None when the client left, its size once past max_body."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                return size
            if not message.get("more_body", False):
                return chunks

    async def _too_slow(self, scope, receive, send) -> None:
        self.metrics.rejected.labels("body_timeout").inc()
        resp = error(
            408,
            "body_timeout",
            f"the request body did not arrive within body_timeout_s={self.body_timeout:g} s; "
            "send it at once",
            limits={"body_timeout_s": self.body_timeout},
        )
        resp.headers["Connection"] = "close"  # what is left of the body is not read
        await resp(scope, receive, send)

    async def _too_large(self, scope, receive, send) -> None:
        resp = error(
            413,
            "body_too_large",
            f"the request body exceeds max_body_bytes={self.max_body}; send less per request",
            limits={"max_body_bytes": self.max_body},
        )
        await resp(scope, receive, send)


def _unauthorized(what: str) -> JSONResponse:
    resp = error(
        401, "unauthorized", f"send {what} as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
    )
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def _content_type(headers: dict[bytes, bytes]) -> bytes:
    """The media type of the Content-Type header, lower case, without its parameters."""
    return headers.get(b"content-type", b"").split(b";")[0].strip().lower()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
