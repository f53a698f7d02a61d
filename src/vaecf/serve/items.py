"""The item routes: the items similar to one, item search, the model card."""

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from vaecf.errors import VaecfError
from vaecf.serve.schemas import (
    NO_CONTROL,
    ItemsResponse,
    ModelCard,
    SimilarResponse,
    documented,
    error,
)
from vaecf.serve.service import Service

MAX_SEARCH = 100  # items a search answers at most


def router(svc: Service) -> APIRouter:
    r = APIRouter()
    holder = svc.holder

    @r.get(
        "/v1/items/{item_id}/similar",
        response_model=SimilarResponse,
        response_model_exclude_unset=True,
        responses=documented(401, 404, 421, 422, 503),
        tags=["recommend"],
    )
    async def similar(
        item_id: Annotated[str, Path(max_length=256)],
        k: Annotated[int, Query(ge=1, le=svc.settings.max_k)] = 10,
    ):
        """The k items most similar to `item_id` under the model (cosine of item vectors)."""
        model = holder.current
        try:
            found = await svc.on_worker(model.recommender.similar_items, item_id, k)
        except VaecfError as e:
            return error(422, "not_supported", str(e))
        if isinstance(found, Response):  # refused or given up (503, 499)
            return found
        if found.unknown:
            return error(404, "unknown_item", f"item {item_id!r} is not in the model's vocabulary")
        vocab = model.recommender.items
        raw = vocab.id_of(vocab.index_of([item_id])[0])[0]  # the id as the data spells it
        body = {"item_id": raw, "items": found.to_dict()["items"],
                "model": svc.version(model.version)}  # fmt: skip
        return await svc.answer(lambda: body, len(found.item_ids))

    @r.get("/v1/items", response_model=ItemsResponse, responses=documented(401, 421, 422, 503),
           tags=["items"])  # fmt: skip
    async def search(
        q: Annotated[str, Query(min_length=1, max_length=256, pattern=NO_CONTROL)],
        limit: Annotated[int, Query(ge=1, le=MAX_SEARCH)] = 20,
    ):
        """Find items: the item whose id is `q`, then the items whose name holds every word of
        `q` (any case), most popular first."""
        model = holder.current
        found = await svc.on_worker(model.recommender.search, q, limit)
        if isinstance(found, Response):
            return found
        return {
            "items": [{"item_id": i, "title": t} for i, t in found],
            "model": svc.version(model.version),
        }

    @r.get("/v1/model", response_model=ModelCard, responses=documented(401, 421), tags=["items"])
    async def model_card():
        """The model served: its name and settings, the data it was trained on, its validation
        and test metrics, when it was loaded."""
        return svc.model_card()

    return r
