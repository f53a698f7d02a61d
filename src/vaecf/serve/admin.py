"""The admin route: reload the model. Who may call it (the admin key, or a loopback-only server,
and JSON only) is the Guard's (guard.py)."""

from typing import Annotated

from fastapi import APIRouter, Body

from vaecf.serve.schemas import ReloadRequest, ReloadResponse, documented
from vaecf.serve.service import Service


def router(svc: Service) -> APIRouter:
    r = APIRouter(tags=["admin"])

    @r.post(
        "/v1/admin/reload",
        response_model=ReloadResponse,
        responses=documented(400, 401, 403, 404, 413, 415, 421, 422, 429, 500),
    )
    async def reload(req: Annotated[ReloadRequest, Body()]):
        """Load the current run's best model again (`{}`), or another run directory's; check
        it and swap it in. A model that fails leaves the old one serving (422 or 500, JSON).
        The body is a JSON object, sent as application/json: what a web page cannot make a
        browser send without the server's consent."""
        return await svc.reload_model(req.run)

    return r
