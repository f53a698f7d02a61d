"""The server under overload and attack: a bounded queue with deadlines, an answer-size cap, the
Host allow-list and the admin credential, reload limits, a health check that sees the scoring
worker, strict input, and no run paths in answers."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from tests.serve.helpers import Gate, client, running
from vaecf.config.serve import ServeSettings, read_api_key, read_key_file
from vaecf.errors import ConfigError
from vaecf.recommender import Recommender
from vaecf.serve.batcher import Expired, MicroBatcher, Overloaded
from vaecf.serve.fixtures import fresh_run
from vaecf.serve.reload import LoadedModel, ModelHolder

IDS = list(range(1000, 1040))
SMALL = {"hidden_dims": [16], "latent_dim": 8}
ADMIN_KEY = "admin-" + "a" * 20
API_KEY = "api-" + "b" * 20


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hard")
    a = fresh_run(root / "runs" / "a", len(IDS), "multvae", SMALL, IDS, seed=1)
    b = fresh_run(root / "runs" / "b", len(IDS), "ease", None, IDS, seed=2)
    return {"a": a, "b": b, "root": root}


# -- 1. backpressure ------------------------------------------------------------------------------
def test_the_queue_is_bounded_and_given_up_jobs_are_never_scored(runs):
    model = LoadedModel(Recommender.load(runs["a"]))
    gate = Gate(model.recommender)
    batches = []

    async def go():
        b = MicroBatcher(
            wait_s=0.001,
            max_batch_size=3,
            max_queue=4,
            timeout_s=0.4,
            on_batch=lambda h, r, s: batches.append(h),
        )
        await b.start()
        first = asyncio.ensure_future(b.submit(model, [[1000]], 3))
        while not gate.entered.is_set():  # the worker is scoring `first`, held at the gate
            await asyncio.sleep(0.005)
        queued = [asyncio.ensure_future(b.submit(model, [[1001 + i]], 3)) for i in range(4)]
        await asyncio.sleep(0.05)
        assert b.queued == 4
        with pytest.raises(Overloaded, match="max_queue=4"):  # refused at once, not queued
            await b.submit(model, [[1010]], 3)
        queued[0].cancel()  # its client left: its place goes back at once
        await asyncio.sleep(0.01)
        assert b.queued == 3
        late = [asyncio.ensure_future(b.submit(model, [[1020]], 3))]
        outcomes = await asyncio.gather(*queued[1:], *late, return_exceptions=True)
        assert all(isinstance(o, Expired) for o in outcomes)  # the deadline passed first
        gate.open.set()
        with pytest.raises(Expired):  # it was being scored when its deadline passed
            await first
        after = await b.submit(model, [[1030], [1031]], 3)  # the server recovers
        await b.stop()
        return after

    with gate:
        after = asyncio.run(go())
    assert len(after) == 2
    # scored: the first job (taken before its deadline), then the one after; nothing that
    # had given up or left
    assert gate.calls == [1, 2] and batches == [1, 2]


def test_micro_batches_never_exceed_max_batch_size(runs):
    model = LoadedModel(Recommender.load(runs["a"]))
    gate = Gate(model.recommender)
    sizes = []

    async def go():
        b = MicroBatcher(wait_s=0.001, max_batch_size=5, on_batch=lambda h, r, s: sizes.append(h))
        await b.start()
        first = asyncio.ensure_future(b.submit(model, [[1000]], 2))
        while not gate.entered.is_set():
            await asyncio.sleep(0.005)
        jobs = [asyncio.ensure_future(b.submit(model, [[1001]] * n, 2)) for n in (3, 3, 2, 4, 1)]
        await asyncio.sleep(0.05)
        gate.open.set()
        await asyncio.gather(first, *jobs)
        await b.stop()

    with gate:
        asyncio.run(go())
    assert sum(sizes) == 1 + 13 and max(sizes) <= 5  # 3+3 would have been 6


def test_overload_over_http_gets_fast_503s_and_health_sees_the_stuck_worker(runs):
    settings = ServeSettings(
        run=str(runs["a"]), max_queue=4, request_timeout_s=5, stuck_after_s=1.0, max_batch=4,
        max_batch_size=4,
    )  # fmt: skip
    holder = ModelHolder.load(settings.run)
    # a similar-items call holds the scoring thread
    gate = Gate(holder.current.recommender, "similar_items")
    with gate, running(settings, holder) as (base, _):

        async def flood():
            async with httpx.AsyncClient(base_url=base, timeout=30) as c:
                held = asyncio.ensure_future(c.get("/v1/items/1000/similar"))
                while not gate.entered.is_set():
                    await asyncio.sleep(0.005)
                t0 = time.perf_counter()
                tasks = [
                    asyncio.ensure_future(c.post("/v1/recommend", json={"items": [1001 + i]}))
                    for i in range(16)
                ]
                while sum(t.done() for t in tasks) < 8 and time.perf_counter() - t0 < 5:
                    await asyncio.sleep(0.005)
                refused_in = time.perf_counter() - t0
                await asyncio.sleep(0.2)  # any refusal still on its way
                refused = [t.result() for t in tasks if t.done()]
                await asyncio.sleep(max(0.0, 1.1 - (time.perf_counter() - t0)))  # --stuck-after
                health = await c.get("/healthz")
                t1 = time.perf_counter()
                ready = await c.get("/readyz")
                probe_s = time.perf_counter() - t1
                gate.open.set()
                return await held, refused, await asyncio.gather(*tasks), refused_in, health, \
                    ready, probe_s  # fmt: skip

        held, refused, answers, refused_in, health, ready, probe_s = asyncio.run(flood())
        with client(base) as c:
            healed = c.get("/healthz")
            metrics = c.get("/metrics").text
    assert held.status_code == 200
    # 4 fit the queue, and the worker may already have taken 4 of them (a batch waiting for
    # the thread) and so made room for 4 more: 8 to 12 are refused at once, the rest answered
    # once the thread is free
    assert 8 <= len(refused) <= 12 and refused_in < 4  # not after the 5 s deadline
    for r in refused:
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"] == "overloaded"
    n = len(refused)
    assert sorted(r.status_code for r in answers) == [200] * (16 - n) + [503] * n
    assert health.status_code == 503 and "scoring call has run" in health.json()["message"]
    assert ready.status_code == 200 and probe_s < 1  # the event loop stayed free
    assert healed.status_code == 200
    assert 'vaecf_rejected_total{reason="overloaded"}' in metrics
    for name in ("vaecf_queue_histories", "vaecf_requests_in_flight", "vaecf_scoring_seconds"):
        assert name in metrics


def test_a_client_that_leaves_is_counted_and_not_scored(runs):
    settings = ServeSettings(run=str(runs["a"]))
    holder = ModelHolder.load(settings.run)
    gate = Gate(holder.current.recommender, "similar_items")
    scored = Gate(holder.current.recommender)
    scored.open.set()
    with gate, running(settings, holder) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        with client(base) as c:
            blocker = threading.Thread(target=c.get, args=("/v1/items/1000/similar",))
            blocker.start()
            assert gate.entered.wait(10)
            body = b'{"items": [1002]}'
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(
                    b"POST /v1/recommend HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                time.sleep(0.2)  # queued behind the held call; then the client goes away
            time.sleep(0.2)
            gate.open.set()
            blocker.join(10)
            deadline = time.monotonic() + 10
            while 'status="499"' not in (m := c.get("/metrics").text):
                assert time.monotonic() < deadline, m
                time.sleep(0.05)
    assert scored.calls == []  # the departed client's history was never scored


# -- 2. the answer-size cap -----------------------------------------------------------------------
def test_answers_are_capped_by_histories_times_k(runs):
    settings = ServeSettings(run=str(runs["a"]), max_answer_items=50, max_k=30, max_batch=4)
    with running(settings) as (base, _), client(base) as c:
        big = c.post("/v1/recommend/batch", json={"histories": [[1000]] * 2, "k": 30})
        ok = c.post("/v1/recommend/batch", json={"histories": [[1000]] * 2, "k": 25})
    assert big.status_code == 422 and big.json()["error"] == "answer_too_large"
    assert big.json()["limits"]["max_answer_items"] == 50 and "60 items" in big.json()["message"]
    assert ok.status_code == 200 and len(ok.json()["results"]) == 2


# -- 3. Host names, the admin credential, reload limits -------------------------------------------
def test_dns_rebinding_and_simple_requests_cannot_reload(runs):
    settings = ServeSettings(run=str(runs["a"]), reload_min_interval_s=0)
    with running(settings) as (base, _), client(base) as c:
        rebound = c.post(
            "/v1/admin/reload",
            headers={"host": "attacker.example", "content-type": "application/json"},
            content=b"{}",
        )
        also_api = c.post(
            "/v1/recommend", json={"items": [1000]}, headers={"host": "attacker.example:8000"}
        )
        probe = c.get("/healthz", headers={"host": "10.1.2.3:8000"})  # a pod-IP health check
        plain = c.post("/v1/admin/reload", headers={"content-type": "text/plain"}, content=b"")
        for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
            assert c.get("/metrics", headers={"host": host}).status_code == 200, host
        json_ok = c.post("/v1/admin/reload", json={})
    assert rebound.status_code == 421 and rebound.json()["error"] == "host_not_allowed"
    assert also_api.status_code == 421 and plain.status_code == 415
    assert probe.status_code == 200
    assert json_ok.status_code == 200
    wide = ServeSettings(run=str(runs["a"]), allowed_hosts=["recs.example.com"])
    with running(wide) as (base, _), client(base) as c:
        assert c.get("/metrics", headers={"host": "recs.example.com"}).status_code == 200
        assert c.get("/metrics", headers={"host": "other.example"}).status_code == 421
    anyone = ServeSettings(run=str(runs["a"]), allowed_hosts=["*"])
    with running(anyone) as (base, _), client(base) as c:
        assert c.get("/metrics", headers={"host": "other.example"}).status_code == 200


def test_admin_routes_need_their_own_key(runs):
    keyed = ServeSettings(
        run=str(runs["a"]), api_key=API_KEY, admin_key=ADMIN_KEY, reload_min_interval_s=0
    )
    with running(keyed) as (base, _), client(base) as c:
        api = {"authorization": f"Bearer {API_KEY}"}
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        assert c.post("/v1/recommend", json={"items": [1000]}, headers=api).status_code == 200
        assert c.post("/v1/admin/reload", json={}, headers=api).status_code == 401
        assert c.post("/v1/admin/reload", json={}).status_code == 401
        assert c.post("/v1/admin/reload", json={}, headers=admin).status_code == 200
        assert c.post("/v1/recommend", json={"items": [1000]}, headers=admin).status_code == 401
    # not loopback-only and no admin key: the admin routes are off
    public = ServeSettings(run=str(runs["a"]), host="0.0.0.0", api_key=API_KEY, allowed_hosts=["*"])
    with running(public) as (base, _), client(base) as c:
        r = c.post("/v1/admin/reload", json={}, headers={"x-api-key": API_KEY})
        assert r.status_code == 403 and "--admin-key-file" in r.json()["message"]


def test_reloads_are_rate_limited(runs):
    settings = ServeSettings(run=str(runs["a"]), reload_min_interval_s=30)
    with running(settings) as (base, _), client(base) as c:
        first = c.post("/v1/admin/reload", json={})
        second = c.post("/v1/admin/reload", json={})
    assert first.status_code == 200
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 29


# -- 4. similar: norms taken once -----------------------------------------------------------------
@pytest.mark.parametrize("model", ["a", "b"])
def test_similar_items_match_a_float64_cosine_with_norms_taken_at_load(runs, model):
    rec = Recommender.load(runs[model])
    v = rec.model.item_vectors().double().numpy()
    assert rec.item_norms is not None
    np.testing.assert_allclose(rec.item_norms.numpy(), np.linalg.norm(v, axis=1), rtol=1e-5)
    calls = []
    rec.model.item_vectors = lambda: calls.append(1)  # a call would now fail
    for i in (0, 7):
        got = rec.similar_items(IDS[i], k=5)
        cos = v @ v[i] / (np.linalg.norm(v, axis=1) * np.linalg.norm(v[i]))
        cos[i] = -np.inf
        np.testing.assert_allclose(got.scores, np.sort(cos)[::-1][:5], rtol=1e-4, atol=1e-6)
    assert calls == []


# -- 5. reload reads what it checked --------------------------------------------------------------
def test_reload_refuses_files_that_link_outside_the_root(runs, tmp_path):
    import shutil

    root = runs["root"] / "runs"
    linked = root / "linked"
    shutil.copytree(runs["b"], linked)
    outside = tmp_path / "best.pt"
    shutil.copy(linked / "best.pt", outside)
    (linked / "best.pt").unlink()
    os.symlink(outside, linked / "best.pt")
    holder = ModelHolder.load(runs["a"])
    from vaecf.serve.reload import RunForbidden

    with pytest.raises(RunForbidden, match="best.pt links outside"):
        holder.reload(str(linked))
    shutil.rmtree(linked)
    (root / "via").symlink_to(runs["b"])  # a linked directory inside the root: its target loads
    try:
        assert holder.reload(str(root / "via")).version["run"] == str(runs["b"].resolve())
    finally:
        (root / "via").unlink()


# -- 7. strict input, keys, paths -----------------------------------------------------------------
def test_strict_ids_k_and_text_fields(runs):
    settings = ServeSettings(run=str(runs["a"]), reload_min_interval_s=0)
    with running(settings) as (base, _), client(base) as c:
        odd = c.post("/v1/recommend", json={"items": ["1_000", "١٠٠٠", " 1000", "1000"]}).json()
        k_bool = c.post("/v1/recommend", json={"items": [1000], "k": True})
        k_float = c.post("/v1/recommend", json={"items": [1000], "k": 3.5})
        k_whole = c.post("/v1/recommend", json={"items": [1000], "k": 3.0})  # JSON Schema: integer
        k_text = c.post("/v1/recommend", json={"items": [1000], "k": "3"})
        newline = c.post("/v1/recommend", json={"items": ["10\n00"]})
        forged = c.post("/v1/admin/reload", json={"run": "a\nINFO: forged"})
    assert odd["unknown"] == ["1_000", "١٠٠٠", " 1000"]
    assert k_whole.status_code == 200 and len(k_whole.json()["items"]) == 3
    for r in (k_bool, k_float, k_text, newline, forged):
        assert r.status_code == 422, r.text


def test_paths_are_not_disclosed_unless_asked(runs):
    settings = ServeSettings(run=str(runs["a"]), reload_min_interval_s=0)
    with running(settings) as (base, _), client(base) as c:
        rec = c.post("/v1/recommend", json={"items": [1000]}).json()
        ready = c.get("/readyz").json()
        outside = c.post("/v1/admin/reload", json={"run": "/"}).json()
    root = str(runs["a"].parent.resolve())
    assert rec["model"]["run"] == ready["model"]["run"] == "a"
    assert root not in outside["message"] and outside["model"]["run"] == "a"
    shown = ServeSettings(run=str(runs["a"]), expose_paths=True)
    with running(shown) as (base, _), client(base) as c:
        assert c.get("/readyz").json()["model"]["run"] == str(runs["a"].resolve())


def test_key_files_give_their_first_line_and_refuse_short_keys(tmp_path, monkeypatch):
    f = tmp_path / "key"
    f.write_text(API_KEY + "\nnot part of the key\n")
    assert read_key_file(str(f)) == API_KEY
    f.write_text("short\n")
    with pytest.raises(ConfigError, match="at least 16"):
        read_key_file(str(f))
    monkeypatch.setenv("VAECF_API_KEY", "tiny")
    with pytest.raises(ConfigError, match="VAECF_API_KEY"):
        read_api_key(None)
    with pytest.raises(ConfigError, match="max_batch_size"):
        ServeSettings(max_batch=300, max_batch_size=256)
