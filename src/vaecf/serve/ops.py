"""The operations routes: liveness (/healthz), readiness (/readyz) and Prometheus /metrics."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from vaecf.config.serve import host_name
from vaecf.serve.schemas import ReadyResponse, documented, error
from vaecf.serve.service import Service


def router(svc: Service) -> APIRouter:
    r = APIRouter(tags=["ops"])
    batcher = svc.batcher
    hosts = svc.settings.host_names()  # None: any Host is this server's

    @r.get("/healthz", responses=documented(421, 503))
    async def healthz():
        """The process answers and its scoring worker is alive and not stuck (no auth)."""
        wrong = batcher.health()
        if wrong is not None:
            return error(503, "unhealthy", wrong)
        return {"ok": True}

    @r.get("/readyz", response_model=ReadyResponse, responses=documented(401, 503))
    async def readyz(request: Request):
        """Ready to answer: a model is loaded, the scoring worker runs, no shutdown is under
        way (after SIGTERM this turns 503 first, while requests are still answered). Answered
        whatever the Host header names (a probe names the pod's address), but the model served
        only to a Host this server answers to."""
        if svc.ready["draining"]:
            return error(503, "draining", "shutting down: stop sending requests here")
        if not (svc.ready["value"] and batcher.running):
            return error(503, "not_ready", "starting or shutting down")
        if hosts is not None and host_name(request.headers.get("host", "")) not in hosts:
            return JSONResponse({"ready": True})  # no model: not even "model": null
        return {"ready": True, "model": svc.version(svc.holder.current.version)}

    @r.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **documented(401, 421)},
    )
    async def prometheus():
        """Prometheus metrics: requests and latency by route and status, batch sizes."""
        return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")

    return r
