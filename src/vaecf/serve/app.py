"""create_app: the HTTP API over a ModelHolder, as FastAPI routes (schemas in schemas.py).

Routes hold no model logic: they validate, take the current model, hand the work to the
MicroBatcher (or the scoring thread) and shape the answer. One ASGI middleware (`Guard`) owns
what applies to every request: the API key, the body size limit, metrics, and the rule that no
traceback reaches a client (an unexpected error is logged and answered with a generic JSON 500).
Every error is JSON: {"error": CODE, "message": what to do, ...}.

(No `from __future__ import annotations` here: FastAPI resolves the annotations of routes
whose request models are built per app at run time.)
"""

import asyncio
import contextlib
import logging
import math
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from vaecf import __version__
from vaecf.errors import VaecfError
from vaecf.serve.batcher import Expired, MicroBatcher, Overloaded, Stopped
from vaecf.serve.metrics import Metrics
from vaecf.serve.reload import ModelHolder, RunForbidden, RunNotFound
from vaecf.serve.schemas import (
    BatchResponse,
    ReadyResponse,
    RecommendResponse,
    ReloadRequest,
    ReloadResponse,
    SimilarResponse,
    documented,
    error,
    json_ok,
    request_schemas,
    validation_error,
)
from vaecf.serve.settings import ServeSettings

log = logging.getLogger("vaecf.serve")

UNAUTHENTICATED = ("/healthz",)
PROBES = ("/healthz", "/readyz")  # answered whatever the Host header names
ADMIN = "/v1/admin/"
BIG_ANSWER_ITEMS = 2000  # answers with more items are encoded on a worker thread
SCORING = ("/v1/recommend", "/v1/recommend/batch")
CLIENT_CLOSED = 499  # the client went away before its answer (as nginx counts it)


def busy(metrics: Metrics, reason: str, message: str) -> JSONResponse:
    """503 with Retry-After: 1, counted under `reason` (refused or dropped under load)."""
    metrics.rejected.labels(reason).inc()
    resp = error(503, reason, message)
    resp.headers["Retry-After"] = "1"
    return resp


# -- middleware -------------------------------------------------------------------------------
class Guard:
    """Auth, body size limit, metrics and last-resort error handling for every HTTP request."""

    def __init__(
        self, app, settings: ServeSettings, metrics: Metrics, active: dict, full=lambda: False
    ):
        self.app = app
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
            ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if scope["method"] == "POST" and ctype != b"application/json":
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
        too_large = error(
            413,
            "body_too_large",
            f"the request body exceeds max_body_bytes={self.max_body}; send less per request",
            limits={"max_body_bytes": self.max_body},
        )
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return await too_large(scope, receive, send)
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
                return await too_large(scope, receive, send)
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

        # answer while watching the connection: a client that leaves cancels its request (and
        # so its place in the scoring queue) instead of having its histories scored for nobody
        answer = asyncio.ensure_future(self.app(scope, replay, send))
        left = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((answer, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            if not answer.done() and not state.get("sent"):
                answer.cancel()
                state["status"] = CLIENT_CLOSED
        with contextlib.suppress(asyncio.CancelledError):
            await answer


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# -- the app --------------------------------------------------------------------------------------
def create_app(holder: ModelHolder, settings: ServeSettings) -> FastAPI:
    """The API over `holder`'s model. SIGHUP reloads where the app runs in the main thread."""
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
    # ready: serving; draining: SIGTERM came, /readyz says 503 while requests are still answered
    ready = {"value": False, "draining": False}
    reload_lock = asyncio.Lock()
    last_reload = {"t": -float("inf")}

    def version(v: dict) -> dict:
        """The answer's `model` field: the run directory's path only with --expose-paths."""
        return v if settings.expose_paths else {**v, "run": os.path.basename(v["run"])}

    def hide_paths(message: str) -> str:
        if settings.expose_paths:
            return message
        for path in (str(holder.root), holder.current.version["run"]):
            message = message.replace(path, "<" + os.path.basename(path) + ">")
        return message

    async def reload_model(run: str | None) -> JSONResponse:
        wait = last_reload["t"] + settings.reload_min_interval_s - time.monotonic()
        if wait > 0 or reload_lock.locked():
            metrics.reloads.labels("refused").inc()
            resp = error(
                429,
                "too_many_reloads",
                f"a reload ran less than reload_min_interval_s="
                f"{settings.reload_min_interval_s:g} s ago (or is running); retry later",
                model=version(holder.current.version),
            )
            resp.headers["Retry-After"] = str(max(1, math.ceil(wait)))
            return resp
        async with reload_lock:
            try:
                new = await asyncio.to_thread(holder.reload, run)
            except VaecfError as e:
                metrics.reloads.labels("failed").inc()
                log.warning("reload failed, still serving %s: %s", holder.current.version["id"], e)
                return error(
                    403
                    if isinstance(e, RunForbidden)
                    else 404
                    if isinstance(e, RunNotFound)
                    else 422,
                    "reload_failed",
                    hide_paths(f"{e}; still serving the previous model"),
                    model=version(holder.current.version),
                )
            except Exception:
                metrics.reloads.labels("failed").inc()
                log.exception("reload failed, still serving %s", holder.current.version["id"])
                return error(
                    500,
                    "reload_failed",
                    "the model could not be loaded (the server log says why); still serving "
                    "the previous model",
                    model=version(holder.current.version),
                )
            finally:
                last_reload["t"] = time.monotonic()
            metrics.reloads.labels("ok").inc()
            metrics.model_loaded.set_to_current_time()
            log.info("now serving %s from %s", new.version["id"], new.version["run"])
            return JSONResponse({"reloaded": True, "model": version(new.version)})

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        metrics.model_loaded.set_to_current_time()
        loop = asyncio.get_running_loop()
        hup = False
        if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(
                    signal.SIGHUP, lambda: asyncio.ensure_future(reload_model(None))
                )
                hup = True
        ready["value"] = True
        try:
            yield
        finally:
            ready["value"] = False
            if hup:
                loop.remove_signal_handler(signal.SIGHUP)
            await batcher.stop()

    app = FastAPI(
        title="vaecf",
        version=__version__,
        description="Recommendations from a vaecf run: Mult-VAE, Mult-DAE, RecVAE, EASE or "
        'popularity. Item ids are the data\'s own; 42 and "42" name the same item.',
        lifespan=lifespan,
    )
    app.add_middleware(
        Guard,
        settings=settings,
        metrics=metrics,
        active=active,
        full=lambda: batcher.queued >= settings.max_queue,
    )
    app.state.holder, app.state.batcher, app.state.metrics = holder, batcher, metrics
    app.state.ready = ready  # serve() sets ready["draining"] on SIGTERM

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return validation_error(exc, settings)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error(exc.status_code, code, str(exc.detail))

    RecommendRequest, BatchRequest = request_schemas(settings)

    async def scored(histories, req) -> tuple[list, dict] | JSONResponse:
        model = holder.current  # the model this request is answered by, whatever comes next
        size = len(histories) * req.k
        if size > settings.max_answer_items:
            limit = settings.max_answer_items
            return error(
                422,
                "answer_too_large",
                f"{len(histories)} histories x k={req.k} = {size} items exceeds "
                f"max_answer_items={limit}; ask for fewer histories or a smaller k",
                limits={"max_answer_items": limit, "max_batch": settings.max_batch,
                        "max_k": settings.max_k},
            )  # fmt: skip
        try:
            recs = await batcher.submit(
                model, histories, req.k, req.exclude_seen, req.allow, req.deny
            )
        except Stopped:
            return error(503, "shutting_down", "the server is shutting down; retry elsewhere")
        except Overloaded as e:
            return busy(metrics, "overloaded", str(e))
        except Expired as e:
            return busy(metrics, "deadline_exceeded", str(e))
        except VaecfError as e:
            return error(422, "invalid_request", str(e))
        return recs, version(model.version)

    async def answer(content: Callable[[], dict], items: int) -> Response:
        """The JSON answer; a big one (it can take milliseconds) built off the event loop."""
        if items <= BIG_ANSWER_ITEMS:
            return json_ok(content())
        return await asyncio.to_thread(lambda: json_ok(content()))

    @app.post(
        "/v1/recommend",
        response_model=RecommendResponse,
        responses=documented(401, 413, 421, 422, 503),
        tags=["recommend"],
    )
    async def recommend(req: RecommendRequest):  # type: ignore[valid-type]
        """Top-k items for one history of raw item ids."""
        out = await scored([req.items], req)
        if isinstance(out, JSONResponse):
            return out
        recs, model = out
        return await answer(lambda: {**recs[0].to_dict(), "model": model}, len(recs[0].item_ids))

    @app.post(
        "/v1/recommend/batch",
        response_model=BatchResponse,
        responses=documented(401, 413, 421, 422, 503),
        tags=["recommend"],
    )
    async def recommend_batch(req: BatchRequest):  # type: ignore[valid-type]
        """Top-k items for each of several histories, with the same k and filters."""
        out = await scored(req.histories, req)
        if isinstance(out, JSONResponse):
            return out
        recs, model = out
        return await answer(
            lambda: {"results": [r.to_dict() for r in recs], "model": model},
            sum(len(r.item_ids) for r in recs),
        )

    @app.get(
        "/v1/items/{item_id}/similar",
        response_model=SimilarResponse,
        response_model_exclude_unset=True,
        responses=documented(401, 404, 421, 422, 503),
        tags=["recommend"],
    )
    async def similar(
        item_id: Annotated[str, Path(max_length=256)],
        k: Annotated[int, Query(ge=1, le=settings.max_k)] = 10,
    ):
        """The k items most similar to `item_id` under the model (cosine of item vectors)."""
        model = holder.current
        if not batcher.running:
            return error(503, "shutting_down", "the server is shutting down; retry elsewhere")
        try:
            r = await batcher.call(model.recommender.similar_items, item_id, k)
        except VaecfError as e:
            return error(422, "not_supported", str(e))
        if r.unknown:
            return error(404, "unknown_item", f"item {item_id!r} is not in the model's vocabulary")
        vocab = model.recommender.items
        raw = vocab.id_of(vocab.index_of([item_id])[0])[0]  # the id as the data spells it
        return {"item_id": raw, "items": r.to_dict()["items"], "model": version(model.version)}

    @app.post(
        "/v1/admin/reload",
        response_model=ReloadResponse,
        responses=documented(401, 403, 404, 413, 415, 421, 422, 429, 500),
        tags=["admin"],
    )
    async def reload(req: Annotated[ReloadRequest, Body()]):
        """Load the current run's best model again (`{}`), or another run directory's; check
        it and swap it in. A model that fails leaves the old one serving (422 or 500, JSON).
        The body is a JSON object, sent as application/json: what a web page cannot make a
        browser send without the server's consent."""
        return await reload_model(req.run)

    @app.get("/healthz", tags=["ops"], responses=documented(421, 503))
    async def healthz():
        """The process answers and its scoring worker is alive and not stuck (no auth)."""
        wrong = batcher.health()
        if wrong is not None:
            return error(503, "unhealthy", wrong)
        return {"ok": True}

    @app.get(
        "/readyz", response_model=ReadyResponse, responses=documented(401, 421, 503), tags=["ops"]
    )
    async def readyz():
        """Ready to answer: a model is loaded, the scoring worker runs, no shutdown is under
        way (after SIGTERM this turns 503 first, while requests are still answered)."""
        if ready["draining"]:
            return error(503, "draining", "shutting down: stop sending requests here")
        if not (ready["value"] and batcher.running):
            return error(503, "not_ready", "starting or shutting down")
        return {"ready": True, "model": version(holder.current.version)}

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **documented(401, 421)},
        tags=["ops"],
    )
    async def prometheus():
        """Prometheus metrics: requests and latency by route and status, batch sizes."""
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return app
