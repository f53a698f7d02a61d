"""Service: what the routes share (the model holder, the micro-batcher, metrics, settings, the
ready state) and the steps several routes take: scoring histories, answering in JSON, reloading.
The routers (recommend.py, items.py, admin.py, ops.py) are built over one Service.

(No `from __future__ import annotations` here, as in the route modules.)
"""

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse, Response

from vaecf import rundir
from vaecf.config.serve import ServeSettings
from vaecf.errors import UnknownUserError, VaecfError
from vaecf.models.explain import check_work
from vaecf.serve.batcher import ClientGone, Expired, MicroBatcher, Overloaded, Stopped
from vaecf.serve.invalid import answer_too_large
from vaecf.serve.prometheus import Metrics
from vaecf.serve.reload import ModelHolder, ReloadTimeout, RunForbidden, RunNotFound
from vaecf.serve.schemas import error, json_ok, request_schemas

log = logging.getLogger("vaecf.serve")

BIG_ANSWER_ITEMS = 2000  # answers with more items are encoded on a worker thread


def busy(metrics: Metrics, reason: str, message: str) -> JSONResponse:
    """503 with Retry-After: 1, counted under `reason` (refused or dropped under load)."""
    metrics.rejected.labels(reason).inc()
    resp = error(503, reason, message)
    resp.headers["Retry-After"] = "1"
    return resp


class UserQuery:
    """What a user's recommendation is asked with: k, explain; no filters, their history
    excluded."""

    def __init__(self, k: int, explain: bool = False):
        self.k, self.exclude_seen, self.allow, self.deny = k, True, None, None
        self.explain = explain


QUEUE_ERRORS = (Stopped, Overloaded, Expired, ClientGone)  # the scoring worker did not answer
CLIENT_CLOSED = 499  # the client went away before its answer (as nginx counts it)


def gone() -> Response:
    """The answer to a request whose client left: sent to no one, counted as 499."""
    return Response(status_code=CLIENT_CLOSED)


class Service:
    def __init__(
        self,
        holder: ModelHolder,
        settings: ServeSettings,
        metrics: Metrics,
        batcher: MicroBatcher,
    ):
        self.holder, self.settings, self.metrics, self.batcher = holder, settings, metrics, batcher
        # ready: serving; draining: SIGTERM came, /readyz says 503 while requests are answered
        self.ready = {"value": False, "draining": False}
        self.reload_lock = asyncio.Lock()
        self.last_reload = -float("inf")
        # the request bodies of the scoring routes, with the server's limits in them
        self.RecommendRequest, self.BatchRequest = request_schemas(settings)

    def version(self, v: dict) -> dict:
        """The answer's `model` field: the run directory's path only with --expose-paths."""
        return v if self.settings.expose_paths else {**v, "run": os.path.basename(v["run"])}

    def hide_paths(self, message: str, rec=None) -> str:
        """`message` with the server's paths (and `rec`'s dataset's) cut to their last part,
        unless --expose-paths."""
        if self.settings.expose_paths:
            return message
        data = ((rec.info if rec is not None else {}).get("data") or {}).get("path")
        paths = (str(self.holder.root), self.holder.current.version["run"], data)
        for path in sorted(filter(None, paths), key=len, reverse=True):  # the longest first
            message = message.replace(path, "<" + os.path.basename(path) + ">")
        return message

    async def scored(self, histories, req, model=None) -> tuple[list, dict] | Response:
        """(recommendations, the model's version) for `histories`, or the error answer;
        `model`: the LoadedModel that answers (default: the current one)."""
        s = self.settings
        model = model or self.holder.current  # answers this request, whatever comes next
        size = len(histories) * req.k
        if size > s.max_answer_items:
            return error(
                422,
                "answer_too_large",
                f"{len(histories)} histories x k={req.k} = {size} items exceeds "
                f"max_answer_items={s.max_answer_items}; ask for fewer histories or a smaller k",
                limits={"max_answer_items": s.max_answer_items, "max_batch": s.max_batch,
                        "max_k": s.max_k},
            )  # fmt: skip
        try:
            if req.explain:  # bounded: refused before any work, in words (a 422)
                check_work(histories, req.k)
            recs = await self.batcher.submit(
                model, histories, req.k, req.exclude_seen, req.allow, req.deny, req.explain
            )
        except QUEUE_ERRORS as e:
            return self.not_run(e)
        except VaecfError as e:
            return error(422, "invalid_request", str(e))
        return recs, self.version(model.version)

    async def on_worker(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the scoring worker, under its call queue's admission rule (what a
        route that reads the model does: similar items, search, a user's history); the answer
        to a request refused or given up (503, 499) instead when it did not run. `fn`'s own
        errors are raised."""
        try:
            return await self.batcher.run(fn, *args)
        except QUEUE_ERRORS as e:
            return self.not_run(e)

    def not_run(self, e: Exception) -> Response:
        """The answer to a request the scoring worker did not answer (QUEUE_ERRORS)."""
        if isinstance(e, Stopped):
            return error(503, "shutting_down", "the server is shutting down; retry elsewhere")
        if isinstance(e, ClientGone):
            return gone()
        reason = "overloaded" if isinstance(e, Overloaded) else "deadline_exceeded"
        return busy(self.metrics, reason, str(e))

    async def recommend(self, req, batch: bool) -> Response:
        """The answer to a validated POST /v1/recommend (`batch`: /v1/recommend/batch)."""
        out = await self.scored(req.histories if batch else [req.items], req)
        if isinstance(out, Response):
            return out
        recs, model = out
        if batch:
            return await self.answer(
                lambda: {"results": [r.to_dict() for r in recs], "model": model},
                sum(len(r.item_ids) for r in recs),
            )
        return await self.answer(
            lambda: {**recs[0].to_dict(), "model": model}, len(recs[0].item_ids)
        )

    async def recommend_user(self, user_id: str, k: int, explain: bool = False) -> Response:
        """The answer to GET /v1/users/{user_id}/recommend: the user's history in the run's
        prepared dataset (read on the scoring thread: the first call loads the dataset),
        scored and excluded as any history."""
        model = self.holder.current
        try:
            found = await self.on_worker(self.user_lookup, model.recommender, user_id)
        except UnknownUserError as e:
            return error(404, "unknown_user", str(e))
        except VaecfError as e:
            # the server has no users to look up (the run's dataset is not there): none is found
            return error(404, "no_user_data", self.hide_paths(str(e), model.recommender))
        if isinstance(found, Response):
            return found
        user, idx = found
        history = model.recommender.items.id_of(idx)
        out = await self.scored([history], UserQuery(k, explain), model)
        if isinstance(out, Response):
            return out
        (rec,), version = out
        body = {**rec.to_dict(), "user_id": user, "history": len(history), "model": version}
        return await self.answer(lambda: body, len(rec.item_ids))

    @staticmethod
    def user_lookup(rec, user_id: str) -> tuple:
        """(the user's id as the data spells it, their history's item indices)."""
        return rec.user_histories().find(user_id)

    async def answer(self, content: Callable[[], dict], items: int) -> Response:
        """The JSON answer; a big one (it can take milliseconds) built off the event loop; a 422
        instead when it exceeds max_answer_bytes (long item names)."""
        if items <= BIG_ANSWER_ITEMS:
            resp = json_ok(content())
        else:
            resp = await asyncio.to_thread(lambda: json_ok(content()))
        if len(resp.body) > self.settings.max_answer_bytes:
            return answer_too_large(len(resp.body), items, self.settings)
        return resp

    async def reload_model(self, run: str | None) -> JSONResponse:
        holder, metrics = self.holder, self.metrics
        wait = self.last_reload + self.settings.reload_min_interval_s - time.monotonic()
        if wait > 0 or self.reload_lock.locked():
            metrics.reloads.labels("refused").inc()
            resp = error(
                429,
                "too_many_reloads",
                f"a reload ran less than reload_min_interval_s="
                f"{self.settings.reload_min_interval_s:g} s ago (or is running); retry later",
                model=self.version(holder.current.version),
            )
            resp.headers["Retry-After"] = str(max(1, math.ceil(wait)))
            return resp
        async with self.reload_lock:
            try:
                new = await self.reloaded(run)
            except VaecfError as e:
                metrics.reloads.labels("failed").inc()
                log.warning("reload failed, still serving %s: %s", holder.current.version["id"], e)
                return error(
                    403
                    if isinstance(e, RunForbidden)
                    else 404
                    if isinstance(e, RunNotFound)
                    else 503
                    if isinstance(e, ReloadTimeout)
                    else 422,
                    "reload_failed",
                    self.hide_paths(f"{e}; still serving the previous model"),
                    model=self.version(holder.current.version),
                )
            except Exception:
                metrics.reloads.labels("failed").inc()
                log.exception("reload failed, still serving %s", holder.current.version["id"])
                return error(
                    500,
                    "reload_failed",
                    "the model could not be loaded (the server log says why); still serving "
                    "the previous model",
                    model=self.version(holder.current.version),
                )
            finally:
                self.last_reload = time.monotonic()
            metrics.reloads.labels("ok").inc()
            metrics.model_loaded.set_to_current_time()
            log.info("now serving %s from %s", new.version["id"], new.version["run"])
            choice = new.recommender.precision_choice
            for line in choice.lines() if choice else ():
                log.info("%s", line)
            return JSONResponse({"reloaded": True, "model": self.version(new.version)})

    async def reloaded(self, run: str | None):
        """The holder's reload of `run`, waited for on the event loop up to reload_timeout_s
        (its thread is a daemon's: one stuck on a read is left behind, and exit does not wait
        for it)."""
        pending = self.holder.start_reload(run)  # checks paths (stat only), starts the thread
        done = asyncio.shield(asyncio.wrap_future(pending.finished))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done, self.settings.reload_timeout_s)
        return self.holder.finish(pending, self.settings.reload_timeout_s)

    def model_card(self) -> dict:
        """What the page's model card shows: the model, its settings, the data it was trained
        on and its metrics (paths only with --expose-paths)."""
        loaded = self.holder.current
        rec = loaded.recommender
        card = rundir.card(rec.info or {}, rec.results)  # what `vaecf info RUN` shows
        data = dict(card["data"])
        if not self.settings.expose_paths and data.get("path"):
            data["path"] = os.path.basename(str(data["path"]))
        return {
            "model": self.version(loaded.version),
            "settings": card["settings"],
            "train": card["train"],
            "data": data,
            "validation": card["validation"],
            "test": card["test"],
            "precision": rec.precision,
            "precision_choice": self.precision_choice(rec),
            "titles": rec.names is not None,
            "similar": rec.item_vectors is not None,
        }

    def precision_choice(self, rec) -> dict | None:
        """What --precision auto chose (None: the precision was given); the cache file by its
        name only, unless --expose-paths."""
        if rec.precision_choice is None:
            return None
        choice = rec.precision_choice.to_dict()
        if not self.settings.expose_paths and choice["cache"]:
            choice["cache"] = os.path.basename(choice["cache"])
        return choice
