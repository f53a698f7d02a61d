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
import secrets
import signal
import threading
import time
from typing import Annotated

from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from vaecf import __version__
from vaecf.errors import VaecfError
from vaecf.serve.batcher import MicroBatcher, Stopped
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


# -- middleware -------------------------------------------------------------------------------
class Guard:
    """Auth, body size limit, metrics and last-resort error handling for every HTTP request."""

    def __init__(self, app, settings: ServeSettings, metrics: Metrics, active: dict):
        self.app = app
        self.active = active  # {"n": HTTP requests in progress}, read by the batcher
        self.key = settings.api_key.encode() if settings.api_key else None
        self.max_body = settings.max_body_bytes
        self.metrics = metrics

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given is not None and secrets.compare_digest(given, self.key)

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
            await self._handle(scope, receive, send_wrapped)
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

    async def _handle(self, scope, receive, send):
        headers = dict(scope["headers"])
        if self.key is not None and scope["path"] not in UNAUTHENTICATED:
            if not self._authorized(headers):
                resp = error(
                    401,
                    "unauthorized",
                    "send the API key as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
                )
                resp.headers["WWW-Authenticate"] = "Bearer"
                return await resp(scope, receive, send)
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

        await self.app(scope, replay, send)


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
    )
    ready = {"value": False}
    reload_lock = asyncio.Lock()

    async def reload_model(run: str | None) -> JSONResponse:
        async with reload_lock:
            try:
                new = await asyncio.to_thread(holder.reload, run)
            except VaecfError as e:
                metrics.reloads.labels("failed").inc()
                log.warning("reload failed, still serving %s: %s", holder.current.version, e)
                return error(
                    403
                    if isinstance(e, RunForbidden)
                    else 404
                    if isinstance(e, RunNotFound)
                    else 422,
                    "reload_failed",
                    f"{e}; still serving the previous model",
                    model=holder.current.version,
                )
            except Exception:
                metrics.reloads.labels("failed").inc()
                log.exception("reload failed, still serving %s", holder.current.version)
                return error(
                    500,
                    "reload_failed",
                    "the model could not be loaded (the server log says why); still serving "
                    "the previous model",
                    model=holder.current.version,
                )
            metrics.reloads.labels("ok").inc()
            metrics.model_loaded.set_to_current_time()
            log.info("now serving %s", new.version)
            return JSONResponse({"reloaded": True, "model": new.version})

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
    app.add_middleware(Guard, settings=settings, metrics=metrics, active=active)
    app.state.holder, app.state.batcher, app.state.metrics = holder, batcher, metrics

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
        try:
            recs = await batcher.submit(
                model, histories, req.k, req.exclude_seen, req.allow, req.deny
            )
        except Stopped:
            return error(503, "shutting_down", "the server is shutting down; retry elsewhere")
        except VaecfError as e:
            return error(422, "invalid_request", str(e))
        return recs, model.version

    @app.post(
        "/v1/recommend",
        response_model=RecommendResponse,
        responses=documented(401, 413, 422, 503),
        tags=["recommend"],
    )
    async def recommend(req: RecommendRequest):  # type: ignore[valid-type]
        """Top-k items for one history of raw item ids."""
        out = await scored([req.items], req)
        if isinstance(out, JSONResponse):
            return out
        recs, version = out
        return json_ok({**recs[0].to_dict(), "model": version})

    @app.post(
        "/v1/recommend/batch",
        response_model=BatchResponse,
        responses=documented(401, 413, 422, 503),
        tags=["recommend"],
    )
    async def recommend_batch(req: BatchRequest):  # type: ignore[valid-type]
        """Top-k items for each of several histories, with the same k and filters."""
        out = await scored(req.histories, req)
        if isinstance(out, JSONResponse):
            return out
        recs, version = out
        return json_ok({"results": [r.to_dict() for r in recs], "model": version})

    @app.get(
        "/v1/items/{item_id}/similar",
        response_model=SimilarResponse,
        response_model_exclude_unset=True,
        responses=documented(401, 404, 422, 503),
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
        return {"item_id": raw, "items": r.to_dict()["items"], "model": model.version}

    @app.post(
        "/v1/admin/reload",
        response_model=ReloadResponse,
        responses=documented(401, 403, 404, 413, 422, 500),
        tags=["admin"],
    )
    async def reload(req: Annotated[ReloadRequest | None, Body()] = None):
        """Load the current run's best model again, or another run directory's; check it and
        swap it in. A model that fails leaves the old one serving (422 or 500, JSON)."""
        return await reload_model(req.run if req else None)

    @app.get("/healthz", tags=["ops"])
    async def healthz():
        """The process is up (no auth)."""
        return {"ok": True}

    @app.get("/readyz", response_model=ReadyResponse, responses=documented(401, 503), tags=["ops"])
    async def readyz():
        """Ready to answer: a model is loaded and the scoring worker runs."""
        if not (ready["value"] and batcher.running):
            return error(503, "not_ready", "starting or shutting down")
        return {"ready": True, "model": holder.current.version}

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **documented(401)},
        tags=["ops"],
    )
    async def prometheus():
        """Prometheus metrics: requests and latency by route and status, batch sizes."""
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return app
