"""create_app: the HTTP API (api.py, schemas in schemas.py) and the web page (page.py) over a
ModelHolder, as FastAPI routes sharing one Service (service.py).

Routes hold no model logic: they validate, take the current model, hand the work to the
MicroBatcher (or the scoring thread) and shape the answer. One ASGI middleware (`Guard`) owns
what applies to every request: the API key, the body size limit, metrics, and the rule that no
traceback reaches a client (an unexpected error is logged and answered with a generic JSON 500).
Every error is JSON: {"error": CODE, "message": what to do, ...}.

"""

import asyncio
import contextlib
import logging
import secrets
import signal
import threading
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vaecf.serve import api, page
from vaecf.serve.batcher import MicroBatcher, client_gone
from vaecf.serve.metrics import Metrics
from vaecf.serve.page import PAGE_PATHS
from vaecf.serve.reload import ModelHolder
from vaecf.serve.schemas import error, validation_error
from vaecf.serve.service import CLIENT_CLOSED, Service, busy
from vaecf.serve.settings import ServeSettings
from vaecf.version import __version__

log = logging.getLogger("vaecf.serve")

UNAUTHENTICATED = ("/healthz", *PAGE_PATHS)  # the page is a shell: its data calls need the key
PROBES = ("/healthz", "/readyz")  # answered whatever the Host header names
ADMIN = "/v1/admin/"
SCORING = ("/v1/recommend", "/v1/recommend/batch")


# -- middleware -------------------------------------------------------------------------------
class Guard:
    """Auth, body size limit, metrics and last-resort error handling for every HTTP request."""

    def __init__(
        self,
        app,
        settings: ServeSettings,
        metrics: Metrics,
        active: dict,
        full=lambda: False,
        fast=None,
    ):
        self.app = app
        # fast(path, body) -> the answer to a scoring request, or None to route it as usual
        self.fast = fast
        self.full = full  # whether the scoring queue is full: scoring requests refused unread
        self.active = active  # {"n": HTTP requests in progress}, read by the batcher
        self.key = settings.api_key.encode() if settings.api_key else None
        self.admin_key = settings.admin_key.encode() if settings.admin_key else None
        self.admin_open = settings.admin_open()
        self.hosts = settings.host_names()
        self.max_body = settings.max_body_bytes
        self.metrics = metrics

    @staticmethod
    def _given_key(headers: dict[bytes, bytes]) -> bytes | None:
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given

    def _authorized(self, headers: dict[bytes, bytes], key: bytes) -> bool:
        given = self._given_key(headers)
        return given is not None and secrets.compare_digest(given, key)

    def _host_allowed(self, headers: dict[bytes, bytes]) -> bool:
        """The Host header names this server (DNS rebinding: a page on attacker.example that
        resolves to 127.0.0.1 still sends Host: attacker.example)."""
        if self.hosts is None:
            return True
        host = headers.get(b"host", b"").decode("latin-1").strip().lower()
        if host.startswith("["):  # [::1]:8000
            name = host[1 : host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return name in self.hosts

    def _refusal(self, scope, headers) -> JSONResponse | None:
        """The answer to a request refused before routing (host, credentials), or None."""
        # the probes carry no action: an orchestrator's health check sends Host: POD_IP:PORT
        if scope["path"] not in PROBES and not self._host_allowed(headers):
            return error(
                421,
                "host_not_allowed",
                "this server does not answer to that Host name; start it with "
                "--allowed-host NAME to add one",
            )
        path = scope["path"]
        if path.startswith(ADMIN):
            if self.admin_key is not None:
                if not self._authorized(headers, self.admin_key):
                    return self._unauthorized("the admin key (--admin-key-file)")
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
                return self._unauthorized("the API key")
        return None

    @staticmethod
    def _unauthorized(what: str) -> JSONResponse:
        resp = error(
            401,
            "unauthorized",
            f"send {what} as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
        )
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        state = {"status": 500, "started": False}
        self.active["n"] += 1

        async def send_wrapped(message):
            if message["type"] == "http.response.start":
                state["status"], state["started"] = message["status"], True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                state["sent"] = True
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
            route = scope.get("route")
            label = getattr(route, "path", None) or "(not routed)"
            self.metrics.observe_request(label, state["status"], time.perf_counter() - t0)

    async def _handle(self, scope, receive, send, state):
        headers = dict(scope["headers"])
        refused = self._refusal(scope, headers)
        if refused is not None:
            return await refused(scope, receive, send)
        if scope["path"] in SCORING and self.full():  # overloaded: refuse before any parsing
            msg = "the scoring queue is full (max_queue); retry shortly"
            full = busy(self.metrics, "overloaded", msg)
            return await full(scope, receive, send)
        # what waits (for the scoring queue or thread) watches the connection meanwhile: a
        # client that leaves gives up its request (and its place in the queue) instead of
        # having its histories scored for nobody; the answer's status is then 499
        client_gone.set(lambda: _disconnected(receive))
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return await self._too_large(scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS") and length is None:
            return await self.app(scope, receive, send)
        # buffer the body (at most max_body bytes), then replay it to the app
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                state["status"] = CLIENT_CLOSED
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return await self._too_large(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if self.fast is not None and scope["path"] in SCORING and scope["method"] == "POST":
            if _content_type(headers) == b"application/json":
                resp = await self.fast(scope["path"], body)
                if resp is not None:
                    scope["route"] = _Routed(scope["path"])  # the metrics' route label
                    return await resp(scope, replay, send)
        await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send) -> None:
        resp = error(
            413,
            "body_too_large",
            f"the request body exceeds max_body_bytes={self.max_body}; send less per request",
            limits={"max_body_bytes": self.max_body},
        )
        await resp(scope, receive, send)


def _content_type(headers: dict[bytes, bytes]) -> bytes:
    """The media type of the Content-Type header, lower case, without its parameters."""
    return headers.get(b"content-type", b"").split(b";")[0].strip().lower()


class _Routed:
    """What a request answered by Guard.fast records as its route (for the metrics' label)."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# -- the app --------------------------------------------------------------------------------------
def create_app(holder: ModelHolder, settings: ServeSettings) -> FastAPI:
    """The API and the page over `holder`'s model. SIGHUP reloads where the app runs in the
    main thread."""
    metrics = Metrics()
    active = {"n": 0}
    batcher = MicroBatcher(
        settings.batch_wait_ms / 1000.0,
        settings.max_batch_size,
        metrics.observe_batch,
        in_flight=lambda: active["n"],
        max_queue=settings.max_queue,
        timeout_s=settings.request_timeout_s,
        stuck_after_s=settings.stuck_after_s,
    )
    metrics.watch(lambda: batcher.queued, lambda: active["n"])
    svc = Service(holder, settings, metrics, batcher)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        metrics.model_loaded.set_to_current_time()
        loop = asyncio.get_running_loop()
        hup = False
        if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(
                    signal.SIGHUP, lambda: asyncio.ensure_future(svc.reload_model(None))
                )
                hup = True
        svc.ready["value"] = True
        try:
            yield
        finally:
            svc.ready["value"] = False
            if hup:
                loop.remove_signal_handler(signal.SIGHUP)
            await batcher.stop()

    app = FastAPI(
        title="vaecf",
        version=__version__,
        description="Recommendations from a vaecf run: Mult-VAE, Mult-DAE, RecVAE, EASE or "
        'popularity. Item ids are the data\'s own; 42 and "42" name the same item. A web page '
        "for people is at /.",
        lifespan=lifespan,
    )
    app.add_middleware(
        Guard,
        settings=settings,
        metrics=metrics,
        active=active,
        full=lambda: batcher.queued >= settings.max_queue,
        fast=svc.fast_recommend,
    )
    app.state.holder, app.state.batcher, app.state.metrics = holder, batcher, metrics
    app.state.ready = svc.ready  # serve() sets ready["draining"] on SIGTERM

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return validation_error(exc, settings)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error(exc.status_code, code, str(exc.detail))

    api.add_routes(app, svc)
    page.add_routes(app)
    return app
