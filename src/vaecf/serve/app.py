"""create_app: the app over a ModelHolder: one Service (service.py) shared by the routers of
each concern (recommend.py, items.py, admin.py, ops.py, and page.py for the web page), behind
one middleware (guard.py) that owns what applies to every request: the Host name, the keys,
the limits, metrics, and no traceback to a client. Every route has one code path, and every
error is JSON: {"error": CODE, "message": what to do, ...}.
"""

import asyncio
import contextlib
import signal
import threading

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from vaecf.config.serve import ServeSettings
from vaecf.serve import admin, items, ops, page, recommend
from vaecf.serve.batcher import MicroBatcher
from vaecf.serve.guard import Guard
from vaecf.serve.invalid import validation_error
from vaecf.serve.prometheus import Metrics
from vaecf.serve.reload import ModelHolder
from vaecf.serve.schemas import error
from vaecf.serve.service import Service
from vaecf.version import __version__


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
        max_calls=settings.max_call_queue,
        nice=settings.scoring_nice,
    )
    metrics.watch(lambda: batcher.queued, lambda: active["n"], lambda: batcher.calls_queued)
    svc = Service(holder, settings, metrics, batcher)

    app = FastAPI(
        title="vaecf",
        version=__version__,
        description="Recommendations from a vaecf run, whichever model it holds (Mult-VAE, "
        "Mult-DAE, RecVAE, EASE, EDLAE, inf-AE, a blend, popularity). Item ids are the data's "
        'own; 42 and "42" name the same item. A web page for people is at /.',
        lifespan=_lifespan(svc, batcher, metrics),
        # FastAPI's /docs and /redoc load scripts, styles and fonts from CDNs: page.py serves
        # /docs from the package instead, under the pages' CSP; /redoc is not served
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(Guard, settings=settings, metrics=metrics, active=active, full=batcher.full)
    app.state.svc, app.state.ready = svc, svc.ready  # serve() sets ready["draining"] on SIGTERM

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return validation_error(exc, settings, request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error(exc.status_code, code, str(exc.detail))

    # include_router copies each route onto the app: no layer of routing is added per request
    for router in (recommend.router(svc), items.router(svc), admin.router(svc), ops.router(svc)):
        app.include_router(router)
    app.include_router(page.router())
    return app


def _lifespan(svc: Service, batcher: MicroBatcher, metrics: Metrics):
    """The app's start and stop: the batcher runs, SIGHUP reloads (where the app runs in the
    main thread), and readiness is held between."""

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

    return lifespan
