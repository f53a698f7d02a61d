"""The API's request and response models (pydantic; the request models carry the server's limits,
so /openapi.json states them), and the JSON answers: `json_ok` for a 200, `error` for every
error ({"error": CODE, "message": what to do, ...}; invalid.py words a 422).

(No `from __future__ import annotations` here: FastAPI resolves the annotations of models built
per app at run time.)
"""

import json
from typing import Annotated, Any, Literal

import orjson
from fastapi.responses import JSONResponse, Response
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    model_validator,
)

from vaecf.config.serve import ServeSettings
from vaecf.models.explain import MAX_EXPLAIN_WORK


# A raw item id: the data's own (an int or a string); 42 and "42" name the same item.
def _no_bool_or_text(v: Any) -> Any:
    if isinstance(v, (bool, str)):  # true is not 1 and "3" is not 3 here
        raise ValueError("must be a JSON integer")
    return v


# an integer as JSON Schema has it (3 or 3.0, not 3.5), never a boolean or a string
WholeNumber = Annotated[int, BeforeValidator(_no_bool_or_text)]

# Text never holds control characters (a newline in an id would forge a log line).
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
ID_MAX_LENGTH = 256  # characters of an id given as a string
ItemId = (
    StrictInt
    | Annotated[str, StringConstraints(min_length=1, max_length=ID_MAX_LENGTH, pattern=NO_CONTROL)]
)


def json_ok(content: dict) -> Response:
    """A 200 JSON answer encoded here: the routes' response models document it (OpenAPI) and
    the tests check answers against them, but FastAPI's validation of every item of every
    answer would cost a fifth of the event loop's time under load (and orjson encodes 20x
    faster than the standard library)."""
    try:
        body = orjson.dumps(content)
    except TypeError:  # orjson's integers stop at 64 bits; an unknown id echoed back may not
        body = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(body, media_type="application/json")


def error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status)


# -- schemas --------------------------------------------------------------------------------------
# The examples /docs and /openapi.json show: EASE on ml-latest-small as the README trains it
# (docs/serving.md shows the same answer; tests/serve/test_serve_page.py checks the examples' shapes
# against a live server's answers)
MODEL_EXAMPLE = {
    "id": "8f56f792daf6",
    "run": "ml-latest-small",
    "name": "ease",
    "n_items": 5770,
    "checkpoint": "best.pt",
    "checkpoint_mtime": "2026-11-28T13:00:16+00:00",
    "best_epoch": None,
    "loaded_at": "2026-11-28T13:00:58+00:00",
}
RANKED_EXAMPLE = {
    "items": [
        {"item_id": 356, "score": 0.1670, "title": "Forrest Gump (1994)"},
        {"item_id": 50, "score": 0.1381, "title": "Usual Suspects, The (1995)"},
        {"item_id": 593, "score": 0.1296, "title": "Silence of the Lambs, The (1991)"},
    ],
    "unknown": [],
    "fallback": None,
}


def example(value: Any) -> ConfigDict:
    """A model's config whose JSON Schema carries `value` as its example."""
    return ConfigDict(json_schema_extra={"examples": [value]})


class Because(BaseModel):
    item_id: ItemId = Field(description="a history item that led to the recommendation")
    weight: float = Field(
        description="a linear model's (EASE, EDLAE) exact share of the item's score (the "
        "shares of the whole history sum to it); any other model's fall of the item's score "
        "(its probability, for Mult-VAE, Mult-DAE, RecVAE) without this history item"
    )
    title: str | None = Field(None, description="its name, when the run has names")


class ItemScore(BaseModel):
    item_id: ItemId
    score: float
    title: str | None = Field(
        None, description="the item's name, on every item when the run has names (else absent)"
    )
    because: list[Because] | None = Field(
        None,
        description='with "explain": the history items that led to it most, strongest first '
        "(absent without, and where the list is popularity: see fallback)",
    )


class ModelVersion(BaseModel):
    """Which model answered: run directory, model name, checkpoint and when it was loaded."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [MODEL_EXAMPLE]})
    id: str = Field(description="short hash of run directory, checkpoint mtime and size")
    run: str
    name: str | None
    n_items: int
    checkpoint: str
    checkpoint_mtime: str
    best_epoch: int | None
    loaded_at: str


class Ranked(BaseModel):
    items: list[ItemScore] = Field(description="best first")
    unknown: list[ItemId] = Field(description="history ids the model does not know (ignored)")
    fallback: Literal["popular"] | None = Field(
        description="'popular' when the items are the training popularity ranking, scored by "
        "their share of the training interactions: no history item is known (a cold start) "
        "or, asked to explain, the model is popularity; nothing in the history led to them"
    )


class RecommendResponse(Ranked):
    model_config = example({**RANKED_EXAMPLE, "model": MODEL_EXAMPLE})
    model: ModelVersion


class UserRecommendResponse(RecommendResponse):
    model_config = example({**RANKED_EXAMPLE, "user_id": 1, "history": 232, "model": MODEL_EXAMPLE})
    user_id: ItemId = Field(description="the user, as the run's data spells the id")
    history: int = Field(description="items in the user's history there (not recommended back)")


class BatchResponse(BaseModel):
    model_config = example({"results": [RANKED_EXAMPLE], "model": MODEL_EXAMPLE})
    results: list[Ranked]
    model: ModelVersion


class SimilarResponse(BaseModel):
    model_config = example(
        {
            "item_id": 1,
            "items": [{"item_id": 3114, "score": 0.2777, "title": "Toy Story 2 (1999)"}],
            "model": MODEL_EXAMPLE,
        }
    )
    item_id: ItemId
    items: list[ItemScore] = Field(description="most similar first; score = cosine similarity")
    model: ModelVersion


class FoundItem(BaseModel):
    item_id: ItemId
    title: str | None = Field(description="the item's name; null when the run has none")


class ItemsResponse(BaseModel):
    model_config = example(
        {"items": [{"item_id": 1, "title": "Toy Story (1995)"}], "model": MODEL_EXAMPLE}
    )
    items: list[FoundItem] = Field(description="the item whose id matches, then names, by "
                                   "training popularity")  # fmt: skip
    model: ModelVersion


class PrecisionCandidate(BaseModel):
    precision: str
    batch_ms: list[float] | None = Field(
        description="ms of the fastest scoring call at each of `batch_sizes` (null: not timed)"
    )
    agreement: float | None = Field(
        description="the mean share of fp32's top 10 (history excluded) in this copy's"
    )
    refused: str | None = Field(description="why it may not serve (null: it may)")


class PrecisionChoice(BaseModel):
    """What --precision auto chose: the fastest copy whose top 10 agrees with fp32's (and the
    fastest at small batches beside it, where it is at least 10% faster there)."""

    chosen: str = Field(
        description="the precision served (for the batches over `small_rows` where `small` is set)"
    )
    batch_sizes: list[int] = Field(description="the batch sizes timed")
    candidates: list[PrecisionCandidate]
    source: Literal["measured", "cache"] = Field(
        description="timed by this load, or read from the cache of an earlier one"
    )
    seconds: float = Field(description="what choosing took at this load")
    cache: str | None = Field(description="the cache file (null: not cached)")
    min_agreement: float = Field(description="the top-10 agreement a copy needs")
    notes: list[str]
    small: str | None = Field(
        None,
        description="the precision that scores batches of up to `small_rows` histories "
        "(null: `chosen` scores every batch)",
    )
    small_rows: int = Field(0, description="the most histories a batch `small` scores holds")


PRECISION_EXAMPLE = {
    "chosen": "bf16",
    "batch_sizes": [1, 104],
    "candidates": [
        {"precision": "fp32", "batch_ms": [1.03, 9.43], "agreement": 1.0, "refused": None},
        {"precision": "bf16", "batch_ms": [1.2, 3.97], "agreement": 0.981, "refused": None},
        {"precision": "int8", "batch_ms": [1.04, 4.15], "agreement": 0.985, "refused": None},
    ],
    "source": "measured",
    "seconds": 0.61,
    "cache": "/home/me/.cache/vaecf/serving/precision-3f1c0d9e8b7a6c5d4e3f2a1b.json",
    "min_agreement": 0.9,
    "notes": [],
    "small": "fp32",
    "small_rows": 4,
}


class ModelCard(BaseModel):
    """The model served, what it was trained on, how it scored."""

    model_config = example(
        {
            "model": MODEL_EXAMPLE,
            "settings": {"l2": 177.83, "search": "fast"},
            "train": {"select_metric": "ndcg@100", "seed": 98765},
            "data": {"n_items": 5770, "n_train_users": 519, "fingerprint": "d76a35704f1e6d72"},
            "validation": {"ndcg@100": 0.2983, "n_users": 42},
            "test": {"ndcg@100": 0.3243, "n_users": 41},
            "precision": "bf16",
            "precision_choice": PRECISION_EXAMPLE,
            "titles": True,
            "similar": True,
        }
    )

    model: ModelVersion
    settings: dict[str, Any] = Field(description="the model's settings (its config)")
    train: dict[str, Any] = Field(description="the training settings, as resolved")
    data: dict[str, Any] = Field(description="items, training users, the data's fingerprint")
    validation: dict[str, Any] | None = Field(description="validation metrics of the model")
    test: dict[str, Any] | None = Field(description="test metrics (null: none were scored)")
    precision: str = Field(description="the precision it is served in (auto: the one chosen)")
    precision_choice: PrecisionChoice | None = Field(
        description="with --precision auto, the choice and each candidate's timings; null "
        "when the precision was given"
    )
    titles: bool = Field(description="the run names its items")
    similar: bool = Field(description="the model has item vectors (similar items)")


class ErrorResponse(BaseModel):
    """Every error answer: a code, a message that says what to do, and where it helps the limits
    (`limits`), the failed fields (`errors`) or the model still serving (`model`)."""

    model_config = ConfigDict(extra="allow")
    error: str = Field(
        description="invalid_request, body_too_large, unauthorized, unknown_item, ..."
    )
    message: str


ERROR_MEANING = {
    400: "the body could not be read as JSON text (e.g. not UTF-8)",
    401: "no or a wrong API key (only when the server has one)",
    403: "reload: the run directory is outside --reload-root; admin routes without an admin "
    "key on a server that is not loopback-only",
    415: "admin requests must be sent as application/json",
    421: "the Host header names no name this server answers to (--allowed-host)",
    429: "reload: too soon after the last one (Retry-After)",
    404: "the item is not in the model's vocabulary; the user is not in the run's data, or the "
    "run's prepared dataset is not there (no_user_data); reload: no such run directory",
    413: "the request body exceeds max_body_bytes",
    422: "the request breaks the schema or a limit (named in `limits`); a run that fails to load",
    500: "the model to reload failed in an unexpected way; the old one still serves",
    503: "overloaded (the scoring queue is full or the request's deadline passed: retry after "
    "Retry-After seconds), or starting or shutting down",
}


def documented(*statuses: int) -> dict:
    """The `responses` of a route: its error answers, for /openapi.json."""
    return {c: {"model": ErrorResponse, "description": ERROR_MEANING[c]} for c in statuses}


class ReadyResponse(BaseModel):
    model_config = example({"ready": True, "model": MODEL_EXAMPLE})
    ready: bool
    model: ModelVersion | None = Field(
        None, description="the model served; absent for a Host this server does not answer to"
    )


class ReloadResponse(BaseModel):
    model_config = example({"reloaded": True, "model": MODEL_EXAMPLE})
    reloaded: bool
    model: ModelVersion


class ReloadRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"run": "runs/ml-v2"}]}
    )
    run: str | None = Field(
        None,
        max_length=4096,
        pattern=NO_CONTROL,  # a path with a newline or NUL is no run of ours
        description="run directory to serve (under --reload-root); default the current one",
    )


def request_schemas(s: ServeSettings) -> tuple[type[BaseModel], type[BaseModel]]:
    """The request models, with the server's limits in them (and so in /openapi.json)."""
    History = Annotated[list[ItemId], Field(max_length=s.max_history)]
    Filter = Annotated[list[ItemId] | None, Field(max_length=s.max_filter)]

    # an allow list and a deny list together are refused; the schema says so too
    one_filter = {
        "not": {
            "required": ["allow", "deny"],
            "properties": {"allow": {"type": "array"}, "deny": {"type": "array"}},
        }
    }

    class Filters(BaseModel):
        model_config = ConfigDict(extra="forbid", json_schema_extra=one_filter)
        k: WholeNumber = Field(
            10, ge=1, le=s.max_k, description=f"how many items (max_k {s.max_k})"
        )
        # a JSON boolean only (pydantic would take 0, 1 or "yes" for one)
        exclude_seen: StrictBool = Field(True, description="never recommend the history's items")
        allow: Filter = Field(None, description="recommend only among these ids")
        deny: Filter = Field(None, description="never recommend these ids")
        explain: StrictBool = Field(
            False,
            description="give each item's `because`: the history items that led to it (at "
            f"most {MAX_EXPLAIN_WORK:,} history items x k per request)",
        )

        @model_validator(mode="after")
        def _one_filter(self):
            if self.allow is not None and self.deny is not None:
                raise ValueError("give an allow list or a deny list, not both")
            return self

    class RecommendRequest(Filters):
        model_config = ConfigDict(
            json_schema_extra={**one_filter, "examples": [{"items": [1, 296, 318], "k": 3}]}
        )
        items: History = Field(description=f"the history: raw item ids (max {s.max_history})")

    class BatchRequest(Filters):
        model_config = ConfigDict(
            json_schema_extra={**one_filter, "examples": [{"histories": [[1, 296], [318]], "k": 3}]}
        )
        histories: list[History] = Field(
            max_length=s.max_batch, description=f"histories (max_batch {s.max_batch})"
        )

    return RecommendRequest, BatchRequest
