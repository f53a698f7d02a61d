"""The JSON API's routes over a Service: recommend, similar items, item search, the model card,
reload, and the probes and metrics.

(No `from __future__ import annotations` here: FastAPI resolves the annotations of routes
whose request models are built per app at run time.)
"""

import asyncio
from typing import Annotated

from fastapi import Body, FastAPI, Path, Query
from fastapi.responses import Response

from vaecf.errors import VaecfError
from vaecf.serve.batcher import ClientGone
from vaecf.serve.schemas import (
    NO_CONTROL,
    BatchResponse,
    ItemsResponse,
    ModelCard,
    ReadyResponse,
    RecommendResponse,
    ReloadRequest,
    ReloadResponse,
    SimilarResponse,
    documented,
    error,
)
from vaecf.serve.service import Service, gone

MAX_SEARCH = 100  # items a search answers at most


def add_routes(api: FastAPI, svc: Service) -> None:
    """The API's routes, on the app itself (an included router would add a layer of routing
    to every request)."""
    settings, batcher, holder = svc.settings, svc.batcher, svc.holder
    RecommendRequest, BatchRequest = svc.RecommendRequest, svc.BatchRequest

    @api.post(
        "/v1/recommend",
        response_model=RecommendResponse,
        responses=documented(400, 401, 413, 421, 422, 503),
        tags=["recommend"],
    )
    async def recommend(req: RecommendRequest):  # type: ignore[valid-type]
        """Top-k items for one history of raw item ids."""
        return await svc.recommend(req, batch=False)

    @api.post(
        "/v1/recommend/batch",
        response_model=BatchResponse,
        responses=documented(400, 401, 413, 421, 422, 503),
        tags=["recommend"],
    )
    async def recommend_batch(req: BatchRequest):  # type: ignore[valid-type]
        """Top-k items for each of several histories, with the same k and filters."""
        return await svc.recommend(req, batch=True)

    @api.get(
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
        except ClientGone:
            return gone()
        except VaecfError as e:
            return error(422, "not_supported", str(e))
        if r.unknown:
            return error(404, "unknown_item", f"item {item_id!r} is not in the model's vocabulary")
        vocab = model.recommender.items
        raw = vocab.id_of(vocab.index_of([item_id])[0])[0]  # the id as the data spells it
        return {"item_id": raw, "items": r.to_dict()["items"], "model": svc.version(model.version)}

    @api.get(
        "/v1/items",
        response_model=ItemsResponse,
        responses=documented(401, 421, 422),
        tags=["items"],
    )
    async def search(
        q: Annotated[str, Query(min_length=1, max_length=256, pattern=NO_CONTROL)],
        limit: Annotated[int, Query(ge=1, le=MAX_SEARCH)] = 20,
    ):
        """Find items: the item whose id is `q`, then the items whose name holds every word of
        `q` (any case), most popular first."""
        model = holder.current
        found = await asyncio.to_thread(model.recommender.search, q, limit)
        return {
            "items": [{"item_id": i, "title": t} for i, t in found],
            "model": svc.version(model.version),
        }

    @api.get("/v1/model", response_model=ModelCard, responses=documented(401, 421), tags=["items"])
    async def model_card():
        """The model served: its name and settings, the data it was trained on, its validation
        and test metrics, when it was loaded."""
        return svc.model_card()

    @api.post(
        "/v1/admin/reload",
        response_model=ReloadResponse,
        responses=documented(400, 401, 403, 404, 413, 415, 421, 422, 429, 500),
        tags=["admin"],
    )
    async def reload(req: Annotated[ReloadRequest, Body()]):
        """Load the current run's best model again (`{}`), or another run directory's; check
        it and swap it in. A model that fails leaves the old one serving (422 or 500, JSON).
        The body is a JSON object, sent as application/json: what a web page cannot make a
        browser send without the server's consent."""
        return await svc.reload_model(req.run)

    @api.get("/healthz", tags=["ops"], responses=documented(421, 503))
    async def healthz():
        """The process answers and its scoring worker is alive and not stuck (no auth)."""
        wrong = batcher.health()
        if wrong is not None:
            return error(503, "unhealthy", wrong)
        return {"ok": True}

    @api.get(
        "/readyz", response_model=ReadyResponse, responses=documented(401, 421, 503), tags=["ops"]
    )
    async def readyz():
        """Ready to answer: a model is loaded, the scoring worker runs, no shutdown is under
        way (after SIGTERM this turns 503 first, while requests are still answered)."""
        if svc.ready["draining"]:
            return error(503, "draining", "shutting down: stop sending requests here")
        if not (svc.ready["value"] and batcher.running):
            return error(503, "not_ready", "starting or shutting down")
        return {"ready": True, "model": svc.version(holder.current.version)}

    @api.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **documented(401, 421)},
        tags=["ops"],
    )
    async def prometheus():
        """Prometheus metrics: requests and latency by route and status, batch sizes."""
        return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")
