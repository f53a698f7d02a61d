"""The server's time and queue limits (issue 39): nothing is scored on the event loop, every route
that reads the model waits in a bounded queue with a deadline, slow clients are cut off, reloads
have a deadline and refuse files that would block, and --stuck-after leaves room for the idle
worker's heartbeat. Each test runs a real uvicorn on 127.0.0.1 or the batcher itself, briefly."""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import socket
import threading
import time

import httpx
import pytest

from tests.serve.helpers import Gate, client, running
from vaecf.cli import main
from vaecf.config.serve import ServeSettings
from vaecf.errors import ConfigError, RunError
from vaecf.recommender import Recommender
from vaecf.serve import reload as reload_module
from vaecf.serve.batcher import Expired, MicroBatcher, Overloaded
from vaecf.serve.fixtures import fresh_run
from vaecf.serve.reload import ModelHolder, ReloadTimeout

IDS = list(range(1000, 1040))
SMALL = {"hidden_dims": [16], "latent_dim": 8}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return fresh_run(tmp_path_factory.mktemp("limits") / "runs" / "a", len(IDS), "multvae",
                     SMALL, IDS, seed=1)  # fmt: skip


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def timed_get(c: httpx.Client, path: str) -> tuple[int | None, float]:
    """(status or None when no answer came within the client's timeout, seconds)."""
    t0 = time.perf_counter()
    try:
        status = c.get(path).status_code
    except httpx.TimeoutException:
        status = None
    return status, time.perf_counter() - t0


# -- item 1: no scoring on the event loop ---------------------------------------------------------
def test_probes_answer_while_a_lone_request_is_scored_and_health_sees_it(run):
    """A request alone on an idle server was scored on the event loop's thread: a probe waited
    for the whole scoring call, and the liveness rule could not see it."""
    settings = ServeSettings(run=str(run), stuck_after_s=1.0)
    holder = ModelHolder.load(settings.run)
    gate = Gate(holder.current.recommender)  # a scoring call as slow as we like
    with gate, running(settings, holder) as (base, _), client(base) as c:
        probe = httpx.Client(base_url=base, timeout=2)
        probe.get("/healthz")  # the probe's connection is open before the request arrives
        body = {"histories": [[1000, 1001, 1002]] * 4, "k": 5}
        sender = threading.Thread(
            target=c.post, args=("/v1/recommend/batch",), kwargs={"json": body}
        )
        sender.start()
        assert gate.entered.wait(10)
        t0 = time.monotonic()
        probes = [timed_get(probe, p) for p in ("/healthz", "/readyz", "/healthz")]
        time.sleep(max(0.0, 1.3 - (time.monotonic() - t0)))  # past --stuck-after
        stuck = probe.get("/healthz") if all(s == 200 for s, _ in probes) else None
        gate.open.set()
        sender.join(10)
        probe.close()
    assert [s for s, _ in probes] == [200, 200, 200], probes
    seconds = sorted(t for _, t in probes)
    assert seconds[1] < 0.1 and seconds[-1] < 0.5, probes
    assert stuck.status_code == 503 and "scoring call has run" in stuck.json()["message"]


# -- item 2: one admission rule for every route that reads the model ------------------------------
def record_order(rec: Recommender, order: list) -> None:
    """Note the name of each scoring-thread call of `rec`, in the order they start."""
    for name in ("similar_items", "recommend_batch", "search"):
        inner = getattr(rec, name)

        def called(*args, _inner=inner, _name=name, **kw):
            order.append(_name)
            return _inner(*args, **kw)

        setattr(rec, name, called)


def test_similar_and_search_wait_in_a_bounded_queue_without_starving_recommend(run):
    settings = ServeSettings(run=str(run), max_call_queue=3)
    holder = ModelHolder.load(settings.run)
    rec = holder.current.recommender
    gate = Gate(rec, "similar_items")
    order: list[str] = []
    record_order(rec, order)
    with gate, running(settings, holder) as (base, app):
        batcher = app.state.svc.batcher

        async def flood():
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:

                async def get(path):  # None when no answer comes within a second
                    try:
                        return await asyncio.wait_for(c.get(path), 1.0)
                    except TimeoutError:
                        return None

                held = asyncio.ensure_future(c.get("/v1/items/1000/similar?k=5"))
                while not gate.entered.is_set():
                    await asyncio.sleep(0.005)
                queued = [asyncio.ensure_future(c.get(f"/v1/items/{1001 + i}/similar"))
                          for i in range(3)]  # fmt: skip
                t0 = time.monotonic()
                while getattr(batcher, "calls_queued", 0) < 3 and time.monotonic() - t0 < 2:
                    await asyncio.sleep(0.005)
                refused = [await get("/v1/items/1010/similar?k=30"), await get("/v1/items?q=1011")]
                scored = asyncio.ensure_future(c.post("/v1/recommend", json={"items": [1000]}))
                await asyncio.sleep(0.1)  # queued behind the held call, beside the three
                gate.open.set()
                answered = await asyncio.gather(held, *queued, scored)
                return answered, refused, (await c.get("/metrics")).text

        answered, refused, metrics = asyncio.run(flood())
    assert [r.status_code for r in answered] == [200] * 5
    for r in refused:
        assert r is not None, "waited instead of a 503 at once"
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"] == "overloaded" and "max_call_queue" in r.json()["message"]
    # the recommendation went right after the call in hand, not behind the three waiting
    assert order[:2] == ["similar_items", "recommend_batch"], order
    assert 'vaecf_rejected_total{reason="overloaded"} 2.0' in metrics
    assert "vaecf_queue_calls 0.0" in metrics


def test_a_call_waits_no_longer_than_the_deadline_and_the_worker_recovers():
    release = threading.Event()

    async def go():
        b = MicroBatcher(timeout_s=0.3, max_calls=1)
        await b.start()
        try:
            held = asyncio.ensure_future(b.run(release.wait, 10))  # holds the thread
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            waiting = asyncio.ensure_future(b.run(len, [1]))
            await asyncio.sleep(0.05)
            with pytest.raises(Overloaded, match="max_call_queue=1"):
                await b.run(len, [1])  # refused at once: one waits already
            for task in (held, waiting):
                with pytest.raises(Expired, match="request_timeout_s=0.3"):
                    await task
            waited = time.perf_counter() - t0
            release.set()
            return waited, await b.run(len, [1, 2])
        finally:
            release.set()
            await b.stop()

    waited, after = asyncio.run(go())
    assert 0.2 < waited < 1.0 and after == 2


# -- item 3: slow clients -------------------------------------------------------------------------
def test_dripping_heads_are_cut_so_health_answers_again(run):
    settings = ServeSettings(run=str(run), limit_concurrency=16, head_timeout_s=1.0)
    with running(settings) as (base, _):
        port = port_of(base)
        drips = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(16)]
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)  # sends nothing
        stop = threading.Event()

        def drip():  # a header line every 0.2 s on each, for as long as the server listens
            for s in drips:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            for i in range(30):
                if stop.wait(0.2):
                    return
                for s in drips:
                    if select.select([s], [], [], 0)[0]:
                        continue  # its 408 is there: a line now would draw a reset that drops it
                    try:
                        s.sendall(b"X-Drip-%d: 1\r\n" % i)
                    except OSError:
                        pass

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        time.sleep(0.3)
        full = httpx.get(f"{base}/healthz", timeout=5).status_code  # 16 dripping + this one
        t0 = time.monotonic()
        healthy = None
        while time.monotonic() - t0 < 4:
            if httpx.get(f"{base}/healthz", timeout=5).status_code == 200:
                healthy = time.monotonic() - t0
                break
            time.sleep(0.1)
        stop.set()
        dripper.join(5)
        replies = [s.recv(4096) for s in drips]
        quiet = silent.recv(4096)
        for s in (*drips, silent):
            s.close()
    assert full == 503  # uvicorn's --limit-concurrency: the drips held every place
    assert healthy is not None and healthy < 2.5, healthy
    for r in replies:
        assert r.startswith(b"HTTP/1.1 408") and b'"head_timeout"' in r, r[:200]
    assert quiet == b""  # nothing came: closed without a word


def test_slow_bodies_get_408_and_a_body_left_unread_is_cut(run):
    settings = ServeSettings(run=str(run), body_timeout_s=0.5)
    with running(settings) as (base, _):
        port = port_of(base)
        head = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n"
                b"Content-Length: 1000\r\n\r\n")  # fmt: skip
        slow = socket.create_connection(("127.0.0.1", port), timeout=5)
        slow.sendall(head % (b"/v1/recommend", b"application/json") + b'{"items": [')
        unread = socket.create_connection(("127.0.0.1", port), timeout=5)  # 415, body unread
        unread.sendall(head % (b"/v1/admin/reload", b"text/plain") + b"x")
        t0 = time.monotonic()
        got: dict = {}

        def read(name, s):
            data = b""
            try:
                while chunk := s.recv(4096):
                    data += chunk
            except ConnectionResetError:  # a drip that crossed the server's close: the end too
                pass
            got[name] = (data, time.monotonic() - t0)

        pairs = (("slow", slow), ("unread", unread))
        readers = [threading.Thread(target=read, args=pair) for pair in pairs]
        for r in readers:
            r.start()
        while any(r.is_alive() for r in readers) and time.monotonic() - t0 < 4:
            for s in (slow, unread):  # a byte every 0.1 s: never the whole body in time
                if select.select([s], [], [], 0)[0]:
                    continue  # an answer or the close is there: a byte now would draw a reset
                try:  # (which may drop the answer before the reader has it)
                    s.sendall(b" ")
                except OSError:
                    pass
            time.sleep(0.1)
        for s in (slow, unread):
            s.settimeout(0.1)  # a reader still waiting (a failure) gives up
        for r in readers:
            r.join(5)
        for s in (slow, unread):
            s.close()
        metrics = httpx.get(f"{base}/metrics").text
    data, seconds = got["slow"]
    assert data.startswith(b"HTTP/1.1 408") and b'"body_timeout"' in data, data[:300]
    assert 0.4 < seconds < 1.5
    data, seconds = got["unread"]
    assert data.startswith(b"HTTP/1.1 415") and 1.3 < seconds < 3, (data[:100], seconds)
    assert 'vaecf_rejected_total{reason="body_timeout"} 2.0' in metrics


# -- item 9: reload deadlines, non-regular files, --stuck-after -----------------------------------
def test_stuck_after_below_the_idle_heartbeat_is_refused(run, capsys):
    with pytest.raises(ConfigError, match=r"at least 1 s.*idle"):
        ServeSettings(stuck_after_s=0.5)
    assert main(["serve", str(run), "--stuck-after", "0.9"]) == 2
    assert "--stuck-after" in capsys.readouterr().err


def unblock(fifo) -> None:
    """Open `fifo` for writing and close it: a reader blocked opening it goes on (reads EOF)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader waits
        pass


def test_a_fifo_in_a_run_is_refused_at_once_over_http(run, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(run, root / "a")
    shutil.copytree(run, root / "fifo")
    fifo = root / "fifo" / "items.parquet"
    fifo.unlink()
    os.mkfifo(fifo)
    settings = ServeSettings(run=str(root / "a"), reload_min_interval_s=0, drain_s=2)
    try:
        with running(settings) as (base, _), client(base, timeout=3) as c:
            try:
                r = c.post("/v1/admin/reload", json={"run": str(root / "fifo")})
            except httpx.TimeoutException:
                r = None
            healthy = c.get("/healthz").status_code
    finally:
        unblock(fifo)
    assert r is not None, "the reload blocked on the FIFO"
    assert r.status_code == 422 and "not a regular file" in r.json()["message"]
    assert healthy == 200


def test_a_reload_past_its_deadline_is_abandoned_and_shutdown_is_not_held(run, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    fifo = tmp_path / "never"
    os.mkfifo(fifo)
    loaded = reload_module.load_checked

    def hangs(run_dir, *args):  # a read that blocks until someone opens the FIFO
        with open(fifo, "rb"):
            pass
        return loaded(run_dir, *args)

    settings = ServeSettings(run=str(run), reload_min_interval_s=0, reload_timeout_s=0.5)
    holder = ModelHolder.load(settings.run)
    before = holder.current
    monkeypatch.setattr(reload_module, "load_checked", hangs)
    try:
        with running(settings, holder) as (base, _), client(base, timeout=5) as c:
            t0 = time.monotonic()
            late = c.post("/v1/admin/reload", json={})
            took = time.monotonic() - t0
            again = c.post("/v1/admin/reload", json={})  # the first still reads
            healthy = c.get("/healthz").status_code
            t0 = time.monotonic()
        stopped_in = time.monotonic() - t0  # the server stops with a reload stuck on a read
        stuck = [t for t in threading.enumerate() if t.name == "vaecf-reload"]
        assert stuck and all(t.daemon for t in stuck)  # exit does not wait for it
    finally:
        unblock(fifo)
    for t in stuck:
        t.join(10)
    assert late.status_code == 503 and "did not finish within 0.5 s" in late.json()["message"]
    assert 0.4 < took < 2
    assert again.status_code == 503 and "still reading" in again.json()["message"]
    assert healthy == 200 and stopped_in < 5
    assert holder.current is before  # what the abandoned reload loaded was never swapped in
    with pytest.raises(ReloadTimeout, match="within 0.2 s"):  # the same rule in Python
        monkeypatch.setattr(reload_module, "load_checked", hangs)
        try:
            holder.reload(timeout_s=0.2)
        finally:
            unblock(fifo)
    assert holder.current is before
    with pytest.raises(RunError, match="not a regular file"):
        monkeypatch.setattr(reload_module, "load_checked", loaded)
        bad = tmp_path / "bad"
        shutil.copytree(run, bad)
        (bad / "items.parquet").unlink()
        os.mkfifo(bad / "items.parquet")
        reload_module.load_checked(bad)
