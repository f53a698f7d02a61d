"""The scoring routes: top-k items for one history (/v1/recommend), for several (/batch), or for
a user of the run's data (/v1/users/{user_id}/recommend).

(No `from __future__ import annotations` in the route modules: FastAPI resolves the annotations
of routes whose request models are built per app, with its limits, at run time.)
"""

from typing import Annotated

from fastapi import APIRouter, Path, Query

from vaecf.serve.schemas import (
    NO_CONTROL,
    BatchResponse,
    RecommendResponse,
    UserRecommendResponse,
    documented,
)
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

    @r.get(
        "/v1/users/{user_id}/recommend",
        response_model=UserRecommendResponse,
        responses=documented(401, 404, 421, 422, 503),
    )
    async def recommend_user(
        user_id: Annotated[str, Path(min_length=1, max_length=256, pattern=NO_CONTROL)],
        k: Annotated[int, Query(ge=1, le=svc.settings.max_k)] = 10,
        explain: Annotated[bool, Query(description="each item's `because`")] = False,
    ):
        """Top-k items for a user of the run's prepared dataset, from their history there (a
        training user's items, a held-out user's fold-in items), which is not recommended
        back; 404 for a user the data does not hold."""
        return await svc.recommend_user(user_id, k, explain)

    return r
