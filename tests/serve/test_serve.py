"""The HTTP server (vaecf serve) on a real uvicorn on 127.0.0.1: every route, every limit, auth,
no tracebacks to clients, micro-batched == unbatched answers, hot reload under concurrent
requests, SIGHUP and SIGTERM on a `vaecf serve` subprocess, and the start-up auth rule."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.serve.helpers import client, free_port, running
from vaecf.cli import main
from vaecf.config.serve import ServeSettings
from vaecf.errors import ConfigError
from vaecf.recommender import Recommender
from vaecf.serve.batcher import MicroBatcher
from vaecf.serve.fixtures import fresh_run
from vaecf.serve.reload import ModelHolder, load_checked

IDS = list(range(1000, 1060))  # raw item ids: ints, not positions
SMALL = {"hidden_dims": [16], "latent_dim": 4}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    a = fresh_run(root / "a", len(IDS), "multvae", SMALL, IDS, seed=1)
    b = fresh_run(root / "b", len(IDS), "multdae", {"latent_dim": 4}, IDS, seed=2)
    s = fresh_run(root / "s", 5, "multvae", SMALL, ["a", "42", "b", "c", "d"], seed=3)
    broken = root / "broken"
    shutil.copytree(a, broken)
    (broken / "best.pt").write_bytes(b"not a checkpoint")
    return {"a": a, "b": b, "str": s, "broken": broken}


@pytest.fixture(scope="module")
def rec_a(runs):
    return Recommender.load(runs["a"])


@pytest.fixture(scope="module")
def server(runs):
    settings = ServeSettings(run=str(runs["a"]), max_history=20, max_k=30, max_batch=4)
    settings.max_body_bytes = 4096
    with running(settings) as (base, app):
        yield base, app


def expected(rec, history, k=10, **kw) -> dict:
    return rec.recommend(history, k=k, **kw).to_dict()


def strip_model(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "model"}


def same_answer(got: dict, want: dict) -> bool:
    """The same items in the same order and unknown ids; scores equal up to float32 rounding
    (a history scored in a batch of 1 or of 30 goes through different GEMM kernels)."""
    got, want = strip_model(got), strip_model(want)
    return (
        [i["item_id"] for i in got["items"]] == [i["item_id"] for i in want["items"]]
        and got["unknown"] == want["unknown"]
        and [i["score"] for i in got["items"]]
        == pytest.approx([i["score"] for i in want["items"]], rel=1e-5, abs=1e-9)
    )


# -- routes ---------------------------------------------------------------------------------
def test_a_cold_start_gets_popular_items_flagged(server, rec_a, runs):
    from vaecf import rundir

    base, _ = server
    counts = rundir.load_popularity(runs["a"], len(IDS))
    with client(base) as c:
        cold = c.post("/v1/recommend", json={"items": [77], "k": 5}).json()
        warm = c.post("/v1/recommend", json={"items": [1001], "k": 5}).json()
        batch = c.post("/v1/recommend/batch", json={"histories": [[], [1001]], "k": 5}).json()
    assert cold["fallback"] == "popular" and cold["unknown"] == [77] and warm["fallback"] is None
    assert strip_model(cold) == expected(rec_a, [77], k=5)
    got = [IDS.index(i["item_id"]) for i in cold["items"]]
    assert sorted(counts[got].tolist(), reverse=True) == sorted(counts)[::-1][:5]
    assert [r["fallback"] for r in batch["results"]] == ["popular", None]


def test_recommend_is_the_recommenders_answer_and_names_the_model(server, rec_a, runs):
    base, _ = server
    with client(base) as c:
        r = c.post("/v1/recommend", json={"items": [1001, 1005, 77], "k": 7})
        assert r.status_code == 200
        body = r.json()
    assert strip_model(body) == expected(rec_a, [1001, 1005, 77], k=7)
    assert body["unknown"] == [77]
    assert len(body["items"]) == 7
    assert {1001, 1005}.isdisjoint(i["item_id"] for i in body["items"])
    m = body["model"]
    assert m["run"] == "a" and m["name"] == "multvae"  # the run's name; its path is not shown
    assert m["n_items"] == len(IDS) and m["checkpoint"] == "best.pt" and m["checkpoint_mtime"]


def test_a_number_and_its_string_name_the_same_item(server, runs):
    base, _ = server
    with client(base) as c:
        as_int = c.post("/v1/recommend", json={"items": [1001, 1002]}).json()
        as_str = c.post("/v1/recommend", json={"items": ["1001", "1002"]}).json()
        assert as_int["items"] == as_str["items"] and as_str["unknown"] == []
        assert c.get("/v1/items/1003/similar").json()["item_id"] == 1003
    with running(ServeSettings(run=str(runs["str"]))) as (base_s, _), client(base_s) as c:
        by_number = c.post("/v1/recommend", json={"items": [42], "k": 2}).json()
        by_string = c.post("/v1/recommend", json={"items": ["42"], "k": 2}).json()
        assert by_number["unknown"] == [] and by_number["items"] == by_string["items"]
        assert "42" not in [i["item_id"] for i in by_number["items"]]


def test_filters_and_exclude_seen(server, rec_a):
    base, _ = server
    with client(base) as c:
        allow = [1010, 1011, 1012, 1001]
        r = c.post("/v1/recommend", json={"items": [1001], "k": 10, "allow": allow}).json()
        assert {i["item_id"] for i in r["items"]} == {1010, 1011, 1012}  # 1001 is seen
        deny = list(range(1000, 1050))
        r = c.post("/v1/recommend", json={"items": [1055], "k": 30, "deny": deny}).json()
        assert {i["item_id"] for i in r["items"]} == set(range(1050, 1060)) - {1055}
        both = c.post("/v1/recommend", json={"items": [1], "allow": [1], "deny": [2]})
        assert both.status_code == 422 and "not both" in both.json()["message"]
        seen = c.post("/v1/recommend", json={"items": [1001], "k": 30, "exclude_seen": False})
        assert strip_model(seen.json()) == expected(rec_a, [1001], 30, exclude_history=False)


def test_batch_route_is_recommend_batch(server, rec_a):
    base, _ = server
    histories = [[1001, 1002], [1040], [], [9999, "1003"]]
    with client(base) as c:
        body = c.post("/v1/recommend/batch", json={"histories": histories, "k": 5}).json()
    want = [r.to_dict() for r in rec_a.recommend_batch(histories, 5)]
    assert body["results"] == want
    assert body["results"][3]["unknown"] == [9999] and body["model"]["name"] == "multvae"


def test_any_json_media_type_gets_the_same_answers_and_metrics_label(server):
    """Every scoring request goes through its route, one code path: a JSON body sent as
    application/json or as another JSON media type gets the same answer and the same errors,
    and is counted under its route's label."""
    base, _ = server
    plain = {"Content-Type": "application/json"}
    other = {"Content-Type": "application/merge-patch+json"}
    with client(base) as c:
        for path, body in [
            ("/v1/recommend", {"items": [1, "2", 99999], "k": 5, "deny": [3]}),
            ("/v1/recommend", {"items": [], "k": 3}),
            ("/v1/recommend/batch", {"histories": [[1, 2], [4]], "k": 4, "allow": [5, 6, 7]}),
        ]:
            raw = json.dumps(body)
            a = c.post(path, content=raw, headers=plain)
            b = c.post(path, content=raw, headers=other)
            assert a.status_code == b.status_code == 200
            assert strip_model(a.json()) == strip_model(b.json())
            assert a.headers["content-type"] == b.headers["content-type"]
        bad_bodies = [
            '{"items": [1], "k": 0}',
            '{"items": [1], "k": true}',
            "{",
            '{"items": 5}',
            '{"items": [1], "allow": [2], "deny": [3]}',
            '{"items": [1], "x": 1}',
            '{"items": [1], "exclude_seen": 0}',  # a JSON boolean only, as the schema says
            '{"items": [1], "exclude_seen": "false"}',
        ]
        for bad in bad_bodies:
            a = c.post("/v1/recommend", content=bad, headers=plain)
            b = c.post("/v1/recommend", content=bad, headers=other)
            assert a.status_code == b.status_code == 422, bad
            assert a.json() == b.json()

        def count(label: str) -> float:
            for line in c.get("/metrics").text.splitlines():
                if line.startswith("vaecf_requests_total{") and label in line:
                    return float(line.rsplit(" ", 1)[1])
            return 0.0

        ok = 'route="/v1/recommend",status="200"'
        before, unrouted = count(ok), count('route="(not routed)"')
        assert c.post("/v1/recommend", json={"items": [1], "k": 2}).status_code == 200
        assert count(ok) == before + 1 and count('route="(not routed)"') == unrouted


def test_a_body_that_is_not_utf8_gets_the_documented_400(server):
    """Found by schemathesis' negative mode: bytes that are not UTF-8 JSON text are refused with
    400, as JSON, and /openapi.json documents 400 for the routes that read a body."""
    base, _ = server
    with client(base) as c:
        for path in ("/v1/recommend", "/v1/recommend/batch", "/v1/admin/reload"):
            r = c.post(
                path, content=b"\xde\x87\xff\xfe#h3", headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 400 and r.json()["error"] == "http_error", (path, r.text)
        spec = c.get("/openapi.json").json()["paths"]
        for path in ("/v1/recommend", "/v1/recommend/batch", "/v1/admin/reload"):
            assert "400" in spec[path]["post"]["responses"]


def test_similar_items(server, rec_a):
    base, _ = server
    with client(base) as c:
        body = c.get("/v1/items/1007/similar", params={"k": 4}).json()
        assert body["items"] == rec_a.similar_items(1007, 4).to_dict()["items"]
        assert len(body["items"]) == 4 and 1007 not in [i["item_id"] for i in body["items"]]
        missing = c.get("/v1/items/31337/similar")
        assert missing.status_code == 404 and missing.json()["error"] == "unknown_item"
        assert c.get("/v1/items/1007/similar", params={"k": 31}).status_code == 422


def test_health_ready_metrics_and_openapi(server):
    base, _ = server
    with client(base) as c:
        assert c.get("/healthz").json() == {"ok": True}
        ready = c.get("/readyz").json()
        assert ready["ready"] is True and ready["model"]["name"] == "multvae"
        c.post("/v1/recommend", json={"items": [1001]})
        c.post("/v1/recommend", json={"items": [1001], "k": 0})
        text = c.get("/metrics").text
        assert 'vaecf_requests_total{route="/v1/recommend",status="200"}' in text
        assert 'vaecf_requests_total{route="/v1/recommend",status="422"}' in text
        assert 'vaecf_request_seconds_bucket{le="0.001",route="/v1/recommend"' in text
        assert "vaecf_batch_histories_count" in text
        schema = c.get("/openapi.json").json()
        for path in ("/v1/recommend", "/v1/recommend/batch", "/v1/items/{item_id}/similar"):
            assert path in schema["paths"]
        assert c.get("/docs").status_code == 200
        nowhere = c.get("/v2/nothing")
        assert nowhere.status_code == 404 and nowhere.json()["error"] == "not_found"


# -- limits ---------------------------------------------------------------------------------
def test_limits_answer_422_naming_the_limit(server):
    base, _ = server
    with client(base) as c:
        cases = [
            ({"items": list(range(21))}, "max_history", 20),
            ({"items": [1], "k": 31}, "max_k", 30),
            ({"items": [1], "k": 0}, None, None),
        ]
        for body, limit, value in cases:
            r = c.post("/v1/recommend", json=body)
            assert r.status_code == 422, body
            err = r.json()
            assert err["error"] == "invalid_request"
            if limit:
                assert err["limits"] == {limit: value} and f"{limit}={value}" in err["message"]
        r = c.post("/v1/recommend/batch", json={"histories": [[1]] * 5})
        assert r.status_code == 422 and r.json()["limits"] == {"max_batch": 4}
        r = c.post("/v1/recommend/batch", json={"histories": [[1], list(range(21))]})
        assert r.status_code == 422 and r.json()["limits"] == {"max_history": 20}
        for bad in ({"items": [1.5]}, {"items": [True]}, {"items": [1], "extra": 1}, "[1"):
            kw = {"content": bad} if isinstance(bad, str) else {"json": bad}
            r = c.post("/v1/recommend", headers={"content-type": "application/json"}, **kw)
            assert r.status_code == 422, bad
            assert "Traceback" not in r.text


def test_body_size_limit_413_with_and_without_content_length(server):
    base, _ = server
    big = json.dumps({"items": ["x" * 100] * 50}).encode()  # > 4096 bytes
    with client(base) as c:
        r = c.post("/v1/recommend", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert r.json()["limits"] == {"max_body_bytes": 4096}

        def chunks():  # no Content-Length: chunked transfer encoding
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        r = c.post("/v1/recommend", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "body_too_large"
        ok = c.post("/v1/recommend", json={"items": [1001]})
        assert ok.status_code == 200


# -- auth and errors --------------------------------------------------------------------------
def test_api_key_needed_everywhere_but_healthz(runs):
    settings = ServeSettings(run=str(runs["a"]), api_key="s3cret")
    with running(settings) as (base, _), client(base) as c:
        assert c.get("/healthz").status_code == 200
        for path in ("/readyz", "/metrics", "/openapi.json"):
            assert c.get(path).status_code == 401
        body = {"items": [1001]}
        r = c.post("/v1/recommend", json=body)
        assert r.status_code == 401 and "Bearer" in r.json()["message"]
        wrong = c.post("/v1/recommend", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        bearer = c.post("/v1/recommend", json=body, headers={"Authorization": "Bearer s3cret"})
        assert bearer.status_code == 200
        assert c.post("/v1/recommend", json=body, headers={"X-API-Key": "s3cret"}).is_success
        reload = c.post("/v1/admin/reload", json={})
        assert reload.status_code == 401


def test_no_traceback_reaches_a_client(runs):
    holder = ModelHolder.load(runs["a"])
    rec = holder.current.recommender

    def explode(*a, **kw):
        raise RuntimeError("secret internal detail /etc/passwd")

    rec.recommend_batch = explode
    rec.similar_items = explode
    with running(ServeSettings(run=str(runs["a"])), holder) as (base, _), client(base) as c:
        for r in (
            c.post("/v1/recommend", json={"items": [1001]}),
            c.post("/v1/recommend/batch", json={"histories": [[1001]]}),
            c.get("/v1/items/1001/similar"),
        ):
            assert r.status_code == 500
            assert r.json() == {
                "error": "internal",
                "message": "internal server error; the server log says more",
            }
            assert "secret" not in r.text and "Traceback" not in r.text
        assert c.get("/healthz").status_code == 200  # still serving


# -- micro-batching -------------------------------------------------------------------------
def requests_mix(n: int) -> list[dict]:
    out = []
    for i in range(n):
        body = {"items": [1000 + (i * 7 + j) % 60 for j in range(i % 5 + 1)], "k": 5 + i % 3}
        if i % 4 == 1:
            body["deny"] = [1000 + i % 60]
        if i % 4 == 2:
            body["allow"] = list(range(1000, 1030))
        if i % 6 == 3:
            body["exclude_seen"] = False
        out.append(body)
    return out


def to_kwargs(body: dict) -> dict:
    kw = {"k": body["k"], "exclude_history": body.get("exclude_seen", True)}
    kw.update({f: body[f] for f in ("allow", "deny") if f in body})
    return kw


def test_batcher_gathers_concurrent_jobs_and_answers_as_alone(rec_a, runs):
    model = load_checked(runs["a"])
    bodies = requests_mix(24)
    sizes = []

    async def go():
        b = MicroBatcher(wait_s=0.05, max_batch_size=64, on_batch=lambda h, r, s: sizes.append(r))
        await b.start()
        try:
            return await asyncio.gather(
                *(
                    b.submit(
                        model,
                        [x["items"]],
                        x["k"],
                        x.get("exclude_seen", True),
                        x.get("allow"),
                        x.get("deny"),
                    )
                    for x in bodies
                )
            )
        finally:
            await b.stop()

    got = asyncio.run(go())
    assert sum(sizes) == len(bodies) and len(sizes) < len(bodies)  # gathered into batches
    for body, [rec] in zip(bodies, got):
        assert same_answer(rec.to_dict(), expected(rec_a, body["items"], **to_kwargs(body)))


def test_a_request_alone_is_scored_at_once_on_the_scoring_thread(rec_a, runs):
    """Alone, a request waits for no batch; it is scored on the scoring thread all the same,
    never on the event loop's (issue 39: a probe must answer while it is scored)."""
    model = load_checked(runs["a"])
    in_flight = [1]
    threads = []

    async def go():
        b = MicroBatcher(
            wait_s=0.05,
            on_batch=lambda h, r, s: threads.append(threading.current_thread()),
            in_flight=lambda: in_flight[0],
        )
        await b.start()
        try:
            t0 = time.perf_counter()
            alone = await b.submit(model, [[1001, 1002]], 5)
            alone_s = time.perf_counter() - t0
            in_flight[0] = 2  # another request in the server: the worker scores, after its wait
            t0 = time.perf_counter()
            queued = await b.submit(model, [[1001, 1002]], 5)
            return alone, queued, alone_s, time.perf_counter() - t0
        finally:
            await b.stop()

    alone, queued, alone_s, waited = asyncio.run(go())
    assert all(t is not threading.main_thread() for t in threads) and len(threads) == 2
    assert alone_s < 0.05 <= waited
    want = expected(rec_a, [1001, 1002], 5)
    assert same_answer(alone[0].to_dict(), want) and same_answer(queued[0].to_dict(), want)


def test_requests_that_arrive_together_are_batched_not_scored_inline(rec_a, runs):
    """Requests read in one go each reach submit() before the first is scored: none of them
    is alone, so they go to the worker and are batched (not scored one by one, inline)."""
    model = load_checked(runs["a"])
    active = [0]
    calls = []

    async def request(b, history):
        active[0] += 1  # what the server's middleware does on arrival
        try:
            return await b.submit(model, [history], 5)
        finally:
            active[0] -= 1

    async def go():
        b = MicroBatcher(
            wait_s=0.01,
            on_batch=lambda h, r, s: calls.append((r, threading.current_thread())),
            in_flight=lambda: active[0],
        )
        await b.start()
        try:
            return await asyncio.gather(*(request(b, [1000 + i]) for i in range(10)))
        finally:
            await b.stop()

    got = asyncio.run(go())
    assert sum(r for r, _ in calls) == 10 and len(calls) < 10
    assert all(t is not threading.main_thread() for _, t in calls)
    for i, [rec] in enumerate(got):
        assert same_answer(rec.to_dict(), expected(rec_a, [1000 + i], 5))


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a niceness per thread: Linux")
def test_the_scoring_thread_and_the_threads_it_starts_yield_to_the_event_loop():
    def here_and_in_a_thread_it_starts():
        out = []
        t = threading.Thread(target=lambda: out.append(niceness()))
        t.start()
        t.join()
        return niceness(), out[0]

    async def go(nice):
        b = MicroBatcher(nice=nice)
        await b.start()
        try:
            return await b.run(here_and_in_a_thread_it_starts)
        finally:
            await b.stop()

    base = niceness()
    assert asyncio.run(go(3)) == (min(19, base + 3),) * 2
    assert asyncio.run(go(0)) == (base, base)
    assert niceness() == base  # the event loop's thread keeps its own
    assert ServeSettings().scoring_nice == 0  # beside busy processes 5 cost 1.7-2.6x
    with pytest.raises(ConfigError, match="scoring_nice must be 0-19"):
        ServeSettings(scoring_nice=20)


@pytest.mark.parametrize("wait_ms", [0.0, 20.0])
def test_concurrent_http_requests_batched_or_not_get_the_unbatched_answer(runs, rec_a, wait_ms):
    bodies = requests_mix(32)
    settings = ServeSettings(
        run=str(runs["a"]), batch_wait_ms=wait_ms, max_batch_size=16, max_batch=16
    )

    async def fire(base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            rs = await asyncio.gather(*(c.post("/v1/recommend", json=b) for b in bodies))
            return [r.json() for r in rs], (await c.get("/metrics")).text

    with running(settings) as (base, _):
        answers, metrics = asyncio.run(fire(base))
    for body, ans in zip(bodies, answers):
        assert same_answer(ans, expected(rec_a, body["items"], **to_kwargs(body)))
    line = next(x for x in metrics.splitlines() if x.startswith("vaecf_batch_requests_count"))
    calls = float(line.split()[-1])
    if wait_ms == 0:
        assert calls == len(bodies)  # one request per scoring call
    else:
        assert calls <= len(bodies)


# -- hot reload ------------------------------------------------------------------------------
def test_reload_under_concurrent_requests(runs, rec_a):
    rec_b = Recommender.load(runs["b"])
    history = [1001, 1010, 1020]
    want = {
        str(runs["a"].resolve()): expected(rec_a, history),
        str(runs["b"].resolve()): expected(rec_b, history),
    }
    assert want[str(runs["a"].resolve())] != want[str(runs["b"].resolve())]
    answers, stop = [], threading.Event()

    def hammer(base):
        with client(base) as c:
            while not stop.is_set():
                answers.append(c.post("/v1/recommend", json={"items": history}))

    paths = ServeSettings(run=str(runs["a"]), expose_paths=True, reload_min_interval_s=0)
    with running(paths) as (base, _), client(base) as c:
        workers = [threading.Thread(target=hammer, args=(base,)) for _ in range(3)]
        for w in workers:
            w.start()
        while len(answers) < 20:
            time.sleep(0.01)
        r = c.post("/v1/admin/reload", json={"run": str(runs["b"])})
        assert r.status_code == 200 and r.json()["model"]["name"] == "multdae"
        n_at_swap = len(answers)
        while len(answers) < n_at_swap + 20:
            time.sleep(0.01)
        failed = c.post("/v1/admin/reload", json={"run": str(runs["broken"])})
        missing = c.post("/v1/admin/reload", json={"run": str(runs["a"] / "nope")})
        outside = c.post("/v1/admin/reload", json={"run": str(runs["a"].parent.parent)})
        escape = c.post("/v1/admin/reload", json={"run": str(runs["a"] / ".." / "..")})
        stop.set()
        for w in workers:
            w.join()
        after = c.post("/v1/recommend", json={"items": history}).json()
        again = c.post("/v1/admin/reload", json={})  # the current run (b) again
        no_body = c.post("/v1/admin/reload")  # what any web page could make a browser send
        no_body_json = c.post("/v1/admin/reload", headers={"content-type": "application/json"})
        metrics = c.get("/metrics").text
    assert all(a.status_code == 200 for a in answers)
    runs_seen = [a.json()["model"]["run"] for a in answers]
    assert set(runs_seen) == set(want)  # both models answered
    for a in answers:  # every answer entirely from the model it names
        assert same_answer(a.json(), want[a.json()["model"]["run"]])
    assert runs_seen[-1] == str(runs["b"].resolve())
    assert [b.status_code for b in (failed, missing, outside, escape)] == [422, 404, 403, 403]
    for bad in (failed, missing, outside, escape):
        err = bad.json()
        assert err["error"] == "reload_failed" and "still serving" in err["message"]
        assert err["model"]["run"] == str(runs["b"].resolve())
    assert "corrupted" in failed.json()["message"]
    assert after["model"]["name"] == "multdae" and same_answer(after, want[after["model"]["run"]])
    assert again.status_code == 200 and again.json()["model"]["name"] == "multdae"
    assert no_body.status_code == 415 and no_body_json.status_code == 422  # the body is {}
    assert "outside the directory runs may be reloaded from" in outside.json()["message"]
    assert "outside" in escape.json()["message"]
    assert 'vaecf_reloads_total{outcome="failed"} 4.0' in metrics


def test_reload_root_widens_or_narrows_where_runs_come_from(runs, tmp_path):
    other = fresh_run(tmp_path / "elsewhere" / "c", len(IDS), "multvae", SMALL, IDS, seed=4)
    narrow = ServeSettings(run=str(runs["a"]), reload_root=str(runs["a"]), reload_min_interval_s=0)
    with running(narrow) as (base, _), client(base) as c:
        assert c.post("/v1/admin/reload", json={}).status_code == 200  # the run itself
        assert c.post("/v1/admin/reload", json={"run": str(runs["b"])}).status_code == 403
    wide = ServeSettings(
        run=str(runs["a"]), reload_root=str(tmp_path), expose_paths=True, reload_min_interval_s=0
    )
    with running(wide) as (base, _), client(base) as c:
        r = c.post("/v1/admin/reload", json={"run": str(other)})
        assert r.status_code == 200 and r.json()["model"]["run"] == str(other.resolve())
        assert c.post("/v1/admin/reload", json={"run": str(runs["a"])}).status_code == 403
        assert c.post("/v1/admin/reload", json={}).json()["model"]["run"] == str(other.resolve())


def test_the_model_card_shows_what_precision_auto_chose_and_reloads_choose_again(runs):
    """/v1/model names the copy auto chose and every candidate's timings and agreement (the
    cache file by its name only); a reload of another run chooses for its weights, a reload of
    the same run reads its choice from the cache; a given precision has no choice to show."""
    from vaecf.serve.schemas import ModelCard

    holder = ModelHolder.load(runs["a"], precision="auto", batch_sizes=(1, 4))
    settings = ServeSettings(run=str(runs["a"]), reload_min_interval_s=0)
    cards = []
    with running(settings, holder) as (base, _), client(base) as c:
        cards.append(c.get("/v1/model").json())
        assert c.post("/v1/admin/reload", json={"run": str(runs["b"])}).status_code == 200
        cards.append(c.get("/v1/model").json())
        assert c.post("/v1/admin/reload", json={}).status_code == 200  # b again
        cards.append(c.get("/v1/model").json())
        answer = c.post("/v1/recommend", json={"items": [1001, 1002], "k": 3})
    assert answer.status_code == 200 and len(answer.json()["items"]) == 3
    for card in cards:
        ModelCard.model_validate(card)  # the documented schema
        choice = card["precision_choice"]
        assert card["precision"] == choice["chosen"] and choice["batch_sizes"] == [1, 4]
        ok = {x["precision"]: x for x in choice["candidates"] if x["refused"] is None}
        assert choice["chosen"] in ok and "fp32" in ok
        assert all(x["agreement"] >= choice["min_agreement"] for x in ok.values())
        assert all(len(x["batch_ms"]) == 2 for x in ok.values())
        assert "/" not in choice["cache"]  # without --expose-paths, the file's name only
    assert [c["model"]["name"] for c in cards] == ["multvae", "multdae", "multdae"]
    assert [c["precision_choice"]["source"] for c in cards[1:]] == ["measured", "cache"]
    assert cards[1]["precision_choice"]["cache"] != cards[0]["precision_choice"]["cache"]
    with running(settings) as (base, _), client(base) as c:  # fp32, as given
        card = c.get("/v1/model").json()
    assert card["precision"] == "fp32" and card["precision_choice"] is None


def test_a_choice_of_two_copies_serves_and_shows_both(runs, tmp_path, monkeypatch):
    """Where auto keeps int8 with fp32 for batches of up to 2 (forced: which copies this machine
    finds fastest is not for a test to assume), the server answers one history and a batch as
    the fp32 and int8 copies do, and /v1/model names both."""
    from vaecf.models import serving_choice
    from vaecf.serve.schemas import ModelCard

    monkeypatch.setenv("VAECF_HOME", str(tmp_path))
    monkeypatch.setattr(serving_choice, "pick", lambda cands, sizes: ("int8", "fp32", 2))
    holder = ModelHolder.load(runs["a"], precision="auto", batch_sizes=(1, 4))
    settings = ServeSettings(run=str(runs["a"]))
    hist = [[1001, 1002], [1003], [1004, 1005, 1006]]
    with running(settings, holder) as (base, _), client(base) as c:
        card = c.get("/v1/model").json()
        one = c.post("/v1/recommend", json={"items": hist[0], "k": 5}).json()
        batch = c.post("/v1/recommend/batch", json={"histories": hist, "k": 5}).json()
    ModelCard.model_validate(card)
    choice = card["precision_choice"]
    assert (card["precision"], choice["small"], choice["small_rows"]) == ("int8", "fp32", 2)
    for precision, got, asked in (("fp32", [one], hist[:1]), ("int8", batch["results"], hist)):
        want = Recommender.load(runs["a"], precision=precision).recommend_batch(asked, 5)
        assert [g["items"] for g in got] == [w.to_dict()["items"] for w in want], precision


# -- the CLI: start-up rules, SIGHUP, SIGTERM ---------------------------------------------------
def vaecf_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vaecf", *args]


def test_non_loopback_without_key_is_refused_before_listening(runs, tmp_path, monkeypatch, capsys):
    env = {k: v for k, v in os.environ.items() if k != "VAECF_API_KEY"}
    r = subprocess.run(
        vaecf_cmd("serve", str(runs["a"]), "--host", "0.0.0.0", "--port", "1"),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2
    assert "--api-key-file" in r.stderr and "--no-auth" in r.stderr
    # the same rule and the other start-up refusals, in-process (no subprocess to pay for)
    monkeypatch.delenv("VAECF_API_KEY", raising=False)
    empty = tmp_path / "key"
    empty.write_text("\n")
    assert main(["serve", str(runs["a"]), "--api-key-file", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["serve", str(runs["broken"]), "--port", str(free_port())]) == 2
    assert "corrupted" in capsys.readouterr().err
    assert main(["serve", str(runs["a"]), "--host", "10.0.0.1", "--port", "1"]) == 2
    monkeypatch.setenv("VAECF_API_KEY", "k" * 16)  # a key from the environment satisfies it
    assert main(["serve", str(runs["broken"]), "--host", "10.0.0.1", "--port", "1"]) == 2
    assert "corrupted" in capsys.readouterr().err  # got past the auth rule, to loading


def wait_ready(base: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vaecf serve exited: {proc.communicate()}")
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("vaecf serve did not become ready")


def test_serve_cli_sighup_reloads_and_sigterm_lets_requests_finish(runs):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        vaecf_cmd("serve", str(runs["a"]), "--port", str(port), "--shutdown-delay", "1.5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(base, proc)
        assert httpx.post(f"{base}/v1/recommend", json={"items": [1001]}).status_code == 200
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while 'vaecf_reloads_total{outcome="ok"} 1.0' not in httpx.get(f"{base}/metrics").text:
            assert time.monotonic() < deadline, "SIGHUP did not reload"
            time.sleep(0.05)
        # a request in flight (headers sent, body not yet) when SIGTERM arrives still completes
        body = json.dumps({"items": [1001, 1002], "k": 3}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(
                b"POST /v1/recommend HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:5]
            )
            time.sleep(0.3)  # let the server read the headers
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            # first not ready, while still answering: a load balancer moves away in time
            assert httpx.get(f"{base}/readyz").json()["error"] == "draining"
            assert httpx.post(f"{base}/v1/recommend", json={"items": [1001]}).status_code == 200
            s.sendall(body[5:])
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        assert b'"items"' in reply
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Application shutdown complete" in err and "stopped by SIGTERM" in err
        assert "now serving" in err  # the SIGHUP reload, logged
        assert f"on {base}/ (the page; " in out and "docs at /docs" in out  # the start-up line
        # --precision auto (the default): the choice and a line per candidate at start-up;
        # the SIGHUP reload of the same run read its choice from the cache
        assert "precision auto: " in out and "  fp32  batch 1: " in out
        assert "precision auto: " in err and "timings read from" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_auth_rule_for_addresses():
    from vaecf.config.serve import check_auth

    for host in ("127.0.0.1", "127.0.0.5", "::1", "localhost"):
        check_auth(ServeSettings(host=host))
    for host in ("0.0.0.0", "::", "10.1.2.3", "example.com"):
        with pytest.raises(ConfigError, match="--api-key-file"):
            check_auth(ServeSettings(host=host))
        check_auth(ServeSettings(host=host, api_key="k"))
        check_auth(ServeSettings(host=host, no_auth=True))
    with pytest.raises(ConfigError, match="max_k"):
        ServeSettings(max_k=0)


def test_ids_beyond_64_bits_are_echoed_as_unknown(server):
    base, _ = server
    huge = [-(2**63) - 1, 2**70]
    with client(base) as c:
        one = c.post("/v1/recommend", json={"items": [1001, *huge], "k": 3})
        batch = c.post("/v1/recommend/batch", json={"histories": [huge], "k": 3})
    assert one.status_code == 200 and one.json()["unknown"] == huge
    assert batch.status_code == 200 and batch.json()["results"][0]["unknown"] == huge


def test_a_response_leaves_in_one_write(server):
    """CoalescingTransport over a real asyncio socket transport: what one event-loop step
    writes (uvicorn's status line and headers, then the body) reaches the socket in one write;
    close() sends what is held first; the served answer arrives whole."""
    from vaecf.serve.server import CoalescingTransport

    async def main() -> tuple[list[bytes], bytes]:
        a, b = socket.socketpair()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
        writes, real_write = [], transport.write
        transport.write = lambda data: (writes.append(bytes(data)), real_write(data))
        held = CoalescingTransport(transport, loop)
        held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        held.write(memoryview(b"{}"))
        assert writes == [] and held.get_write_buffer_size() == 40
        await asyncio.sleep(0)  # the step ends: one write of both
        assert len(writes) == 1 and writes[0].endswith(b"\r\n\r\n{}")
        held.write(b"last")
        held.close()  # sends it before closing
        await asyncio.sleep(0.05)
        b.settimeout(5)
        got = b""
        while chunk := b.recv(4096):
            got += chunk
        b.close()
        return writes, got

    writes, got = asyncio.run(main())
    assert writes[1:] == [b"last"]
    assert got == writes[0] + b"last"
    base, _ = server  # the test server runs the same protocol: a whole answer over HTTP
    with client(base) as c:
        r = c.post("/v1/recommend", json={"items": [1, 2], "k": 3})
    assert r.status_code == 200 and len(r.json()["items"]) == 3
