"""The operations routes: liveness (/healthz), readiness (/readyz) and Prometheus /metrics."""

from fastapi import APIRouter
from fastapi.responses import Response

from vaecf.serve.schemas import ReadyResponse, documented, error
from vaecf.serve.service import Service


def router(svc: Service) -> APIRouter:
    r = APIRouter(tags=["ops"])
    batcher = svc.batcher

    @r.get("/healthz", responses=documented(421, 503))
    async def healthz():
        """The process answers and its scoring worker is alive and not stuck (no auth)."""
        wrong = batcher.health()
        if wrong is not None:
            return error(503, "unhealthy", wrong)
        return {"ok": True}

    @r.get("/readyz", response_model=ReadyResponse, responses=documented(401, 421, 503))
    async def readyz():
        """Ready to answer: a model is loaded, the scoring worker runs, no shutdown is under
        way (after SIGTERM this turns 503 first, while requests are still answered)."""
        if svc.ready["draining"]:
            return error(503, "draining", "shutting down: stop sending requests here")
        if not (svc.ready["value"] and batcher.running):
            return error(503, "not_ready", "starting or shutting down")
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
