"""The scoring routes: top-k items for one history (/v1/recommend) or for several (/batch).

(No `from __future__ import annotations` in the route modules: FastAPI resolves the annotations
of routes whose request models are built per app, with its limits, at run time.)
"""

from fastapi import APIRouter

from vaecf.serve.schemas import BatchResponse, RecommendResponse, documented
from vaecf.serve.service import Service

ERRORS = documented(400, 401, 413, 421, 422, 503)


def router(svc: Service) -> APIRouter:
    r = APIRouter(tags=["recommend"])
    RecommendRequest, BatchRequest = svc.RecommendRequest, svc.BatchRequest

    @r.post("/v1/recommend", response_model=RecommendResponse, responses=ERRORS)
    async def recommend(req: RecommendRequest):  # type: ignore[valid-type]
        """Top-k items for one history of raw item ids."""
        return await svc.recommend(req, batch=False)

    @r.post("/v1/recommend/batch", response_model=BatchResponse, responses=ERRORS)
    async def recommend_batch(req: BatchRequest):  # type: ignore[valid-type]
        """Top-k items for each of several histories, with the same k and filters."""
        return await svc.recommend(req, batch=True)

    return r
