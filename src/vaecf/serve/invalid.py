"""The 422 answer to a request that breaks the schema, in words: what was wrong and what to send
instead (a body that is not JSON, not sent as JSON, not an object, or empty; an item id that is
neither an integer nor a short string), the limit a request hit (`limits`), and the failed
fields for a program (`errors`: loc, msg, type)."""

import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from vaecf.config.serve import ServeSettings
from vaecf.serve.schemas import ID_MAX_LENGTH, error

# limit hit by a validation error, by field name
LIMIT_OF = {
    "items": "max_history",
    "histories": "max_batch",
    "k": "max_k",
    "allow": "max_filter",
    "deny": "max_filter",
}
# what to send, by route
EXAMPLES = {
    "/v1/recommend": '{"items": [1, 2, 3], "k": 10}',
    "/v1/recommend/batch": '{"histories": [[1, 2], [3]], "k": 10}',
    "/v1/admin/reload": '{} or {"run": "DIR"}',
}
# pydantic's names of the two kinds an item id may be (a union's members, last in `loc`)
ITEM_ID_KINDS = {"int", "constrained-str"}
ITEM_ID_RULE = (
    f"a JSON integer or a string of 1 to {ID_MAX_LENGTH} characters without control characters"
)


def _shown(value: Any) -> str:
    """A value as JSON, cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _body_problem(e: dict, request: Request) -> str | None:
    """One sentence for an error about the body as a whole, or None when it is about a field."""
    loc = [p for p in e.get("loc", ()) if p != "body"]
    kind = e.get("type")
    example = EXAMPLES.get(request.url.path, "a JSON object")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    as_json = media == "application/json" or media.endswith("+json")
    if kind == "json_invalid":
        why = (e.get("ctx") or {}).get("error") or "not JSON"
        at = f" at character {loc[0]}" if loc else ""
        return f"the body is not valid JSON ({why}{at}): send a JSON object such as {example}"
    if loc:
        return None
    if kind == "missing":
        return f"the body is empty: send a JSON object such as {example}"
    if kind in ("model_attributes_type", "dict_type") and not as_json:
        given = f"Content-Type {media}" if media else "no Content-Type"
        return (
            f"the body was not read as JSON, since the request has {given}: send it with "
            f"Content-Type: application/json, as a JSON object such as {example}"
        )
    if kind in ("model_attributes_type", "dict_type"):
        return (
            f"the body is {_shown(e.get('input'))}, not a JSON object: send one such as {example}"
        )
    return None


def _item_id_errors(errors: list[dict]) -> list[dict]:
    """The errors, with the two an item id of neither kind gets (one per kind) made one."""
    out, seen = [], set()
    for e in errors:
        loc = e["loc"]
        if loc and loc[-1] in ITEM_ID_KINDS:
            where = tuple(loc[:-1])
            if where in seen:
                continue
            seen.add(where)
            e = {"loc": list(where), "msg": f"not an item id: send {ITEM_ID_RULE}",
                 "type": "item_id", "input": e.get("input")}  # fmt: skip
        out.append(e)
    return out


def _sentence(errors: list[dict]) -> str:
    """The field errors in words: bad item ids together, each other error as `field: msg`."""
    ids = [e for e in errors if e["type"] == "item_id"]
    parts = [f"{'.'.join(e['loc']) or 'body'}: {e['msg']}" for e in errors if e not in ids]
    if ids:
        listed = [f"{'.'.join(e['loc'])} ({_shown(e['input'])})" for e in ids[:5]]
        more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
        are = "is not an item id" if len(ids) == 1 else "are not item ids"
        head = ", ".join(listed[:-1]) + " and " + listed[-1] if len(listed) > 1 else listed[0]
        parts.insert(0, f"{head}{more} {are}: send each as {ITEM_ID_RULE}")
    return "; ".join(parts)


def validation_error(
    exc: RequestValidationError, s: ServeSettings, request: Request
) -> JSONResponse:
    raw = exc.errors()
    whole = next((m for m in (_body_problem(e, request) for e in raw) if m), None)
    errors, limits = [], {}
    for e in raw:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        field = loc[0] if loc else ""
        if e.get("type") in ("too_long", "less_than_equal") and field in LIMIT_OF:
            name = LIMIT_OF[field]
            if field == "histories" and len(loc) > 1:
                name = "max_history"  # one history of a batch is too long
            limits[name] = s.limits[name]
        errors.append({"loc": loc, "msg": e.get("msg", ""), "type": e.get("type", ""),
                       "input": e.get("input")})  # fmt: skip
    errors = _item_id_errors(errors)
    message = whole or _sentence(errors)
    for e in errors:
        e.pop("input", None)  # not echoed: it may be big, and bytes are no JSON
    extra = {"limits": limits} if limits else {}
    if limits:
        message += " (server limits: " + ", ".join(f"{k}={v}" for k, v in limits.items()) + ")"
    return error(422, "invalid_request", message, errors=errors, **extra)


def answer_too_large(size: int, items: int, s: ServeSettings) -> JSONResponse:
    """The 422 for an answer of `size` bytes (`items` items) over max_answer_bytes: how many
    items of this size would fit."""
    fit = s.max_answer_bytes * items // size if items else 0
    return error(
        422,
        "answer_too_large",
        f"the answer ({items} items with their names) would be {size} bytes, over "
        f"max_answer_bytes={s.max_answer_bytes}; ask for fewer histories or a smaller k (about "
        f"{fit} items of these fit in one answer)",
        limits={"max_answer_bytes": s.max_answer_bytes, "max_answer_items": s.max_answer_items},
    )
