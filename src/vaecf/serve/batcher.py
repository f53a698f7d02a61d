"""MicroBatcher: the one scoring worker and the bounded queues in front of it. Concurrent
recommendation requests are gathered for a short, bounded wait and scored as one batch; every
other use of the model a request makes (similar items, item search, a user's history) waits in
a queue of its own and runs on the same thread. Nothing is scored on the event loop's thread:
it stays free to answer probes and accept requests while a batch is scored.

The worker takes the first waiting job, waits `wait_s` (unless `max_batch_size` histories are
already queued, or the server is handling no request beyond those in hand: then nobody could
join), takes what has queued up to exactly `max_batch_size` histories, and scores them on its
thread (under load, requests queue while a batch is scored and form the next batch). Jobs are
grouped by what changes the answer (model, k, exclude_seen, allow, deny) and each group is one
`Recommender.recommend_batch` call, so a request's answer is exactly the one it would get
alone. `wait_s = 0` turns batching off: one request per scoring call. When both queues hold
work the worker alternates, a batch then a call, so that neither starves the other: a flood of
similar-items requests delays a recommendation by one call at most.

Backpressure, the same for both queues: a request that would take the recommendation queue past
`max_queue` histories, or the call queue past `max_calls` requests, is refused at once
(`Overloaded`: the server answers 503 with Retry-After), and one not answered within
`timeout_s` gives up (`Expired`, 503). A waiting request watches its connection (`client_gone`,
set per request by the server's middleware): if its client leaves it gives up (`ClientGone`),
and work whose request gave up is dropped before it runs. `health()` reports a worker that
stopped, or whose call on the thread has run longer than `stuck_after_s`, or that has not
turned for that long (it turns every IDLE_BEAT_S when idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from vaecf.config.serve import IDLE_BEAT_S
from vaecf.recommender import Recommendation
from vaecf.runtime import lower_thread_priority
from vaecf.serve.reload import LoadedModel


class Stopped(RuntimeError):
    """The batcher is shutting down and takes no new work."""


class Overloaded(RuntimeError):
    """The queue is full: the request is refused at once (503 with Retry-After)."""


class Expired(RuntimeError):
    """The request was not answered within its deadline (503)."""


class ClientGone(RuntimeError):
    """The request's client closed its connection while the request waited."""


WATCH_AFTER_S = 0.005  # an answer this late has its connection watched (_answer_or_gone)
# per request: a coroutine function that returns when the request's client has disconnected
client_gone: ContextVar[Callable[[], Any] | None] = ContextVar("client_gone", default=None)


async def _answer_or_gone(future: asyncio.Future, timeout: float | None) -> Any:
    """`future`'s result, unless the request's client leaves first (ClientGone) or `timeout`
    seconds pass (TimeoutError). Two timers: the connection is watched (a task reading it) only
    once the answer is WATCH_AFTER_S late; an answer at once costs no task."""
    loop = asyncio.get_running_loop()
    watch, watcher = client_gone.get(), None

    def fail(e: BaseException) -> None:
        future.done() or future.set_exception(e)

    def left(task: asyncio.Task) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: a read that failed means the client is gone too
            fail(ClientGone("the client closed the connection"))

    def start_watching() -> None:
        nonlocal watcher
        if not future.done():
            watcher = asyncio.ensure_future(watch())
            watcher.add_done_callback(left)

    timers = [] if timeout is None else [loop.call_later(timeout, fail, TimeoutError())]
    if watch is not None:
        timers.append(loop.call_later(WATCH_AFTER_S, start_watching))
    try:
        return await future
    finally:
        for handle in (*timers, *([watcher] if watcher is not None else [])):
            handle.cancel()


@dataclass(eq=False)  # a job is itself: found in the queue by identity
class _Job:
    model: LoadedModel
    histories: list[list]
    k: int
    exclude_seen: bool
    allow: tuple | None
    deny: tuple | None
    explain: bool
    future: asyncio.Future

    def key(self) -> tuple:
        # an explained request is scored alone: its explain work is capped per request
        alone = id(self) if self.explain else None
        return (id(self.model), self.k, self.exclude_seen, self.allow, self.deny, alone)


@dataclass(eq=False)
class _Call:
    fn: Callable[..., Any]
    args: tuple
    future: asyncio.Future


class MicroBatcher:
    def __init__(
        self,
        wait_s: float = 0.002,
        max_batch_size: int = 256,
        on_batch: Callable[[int, int, float], None] | None = None,
        in_flight: Callable[[], int] | None = None,
        max_queue: int = 1024,
        timeout_s: float = 10.0,
        stuck_after_s: float = 30.0,
        max_calls: int = 64,
        nice: int = 0,
    ):
        self.wait_s, self.max_batch_size, self.max_queue = wait_s, max_batch_size, max_queue
        self.max_calls, self.timeout_s, self.stuck_after_s = max_calls, timeout_s, stuck_after_s
        self.on_batch = on_batch  # (histories, requests, seconds) of every scoring call
        # requests the server is handling (queued or not yet): with none but those in hand and
        # queued, no one can join the batch and waiting would only add latency
        self.in_flight = in_flight
        self.executor = ThreadPoolExecutor(
            1, thread_name_prefix="vaecf-score", initializer=lower_thread_priority, initargs=(nice,)
        )
        self._jobs: deque[_Job] = deque()
        self._queued = 0  # histories waiting in the queue
        self._calls: deque[_Call] = deque()
        self._calls_turn = False  # both queues hold work: a call goes next (after a batch)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._scoring_since: float | None = None  # when the running scoring call started
        self._beat = time.monotonic()  # the worker loop's last turn

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._stopping

    @property
    def queued(self) -> int:
        """Histories waiting for the worker."""
        return self._queued

    @property
    def calls_queued(self) -> int:
        """Calls (similar items, search, user lookups) waiting for the worker."""
        return len(self._calls)

    def full(self, calls: bool = False) -> bool:
        """Whether the recommendation queue (`calls`: the call queue) has no room left."""
        return len(self._calls) >= self.max_calls if calls else self._queued >= self.max_queue

    def health(self) -> str | None:
        """None when the worker is alive and not stuck, else what is wrong."""
        now = time.monotonic()
        if self._task is None or self._task.done():
            return "the scoring worker is not running"
        since = self._scoring_since
        if since is not None and now - since > self.stuck_after_s:
            return f"a scoring call has run for {now - since:.1f} s (stuck_after_s)"
        if since is None and now - self._beat > self.stuck_after_s:
            return f"the scoring worker has not turned for {now - self._beat:.0f} s"
        return None

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="vaecf-batcher")

    async def stop(self) -> None:
        """Score what is queued, then stop the worker and its thread."""
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.executor.shutdown(wait=True)

    async def submit(
        self,
        model: LoadedModel,
        histories: Sequence[Sequence],
        k: int,
        exclude_seen: bool = True,
        allow: Sequence | None = None,
        deny: Sequence | None = None,
        explain: bool = False,
    ) -> list[Recommendation]:
        """One Recommendation per history, from `model`, scored in some batch (`explain`:
        alone, with each item's `because`)."""
        if not self.running:
            raise Stopped("the server is shutting down")
        job = _Job(
            model,
            [list(h) for h in histories],
            k,
            exclude_seen,
            None if allow is None else tuple(allow),
            None if deny is None else tuple(deny),
            explain,
            asyncio.get_running_loop().create_future(),
        )
        n = len(job.histories)
        if self._queued + n > self.max_queue:
            raise Overloaded(
                f"the scoring queue is full ({self._queued} of max_queue={self.max_queue} "
                "histories waiting); retry shortly"
            )
        self._jobs.append(job)
        self._queued += n
        self._wake.set()
        return await self._answer(job.future, lambda: self._leave(job))

    def _leave(self, job: _Job) -> None:
        if job in self._jobs:  # not taken yet: its place goes back
            self._jobs.remove(job)
            self._queued -= len(job.histories)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the scoring thread, between batches, under the same rule as
        recommendations: refused at once when `max_calls` calls wait (Overloaded), given up
        after `timeout_s` (Expired) or when the client leaves (ClientGone)."""
        if not self.running:
            raise Stopped("the server is shutting down")
        if len(self._calls) >= self.max_calls:
            raise Overloaded(
                f"the scoring worker's call queue is full ({len(self._calls)} of "
                f"max_call_queue={self.max_calls} requests waiting); retry shortly"
            )
        call = _Call(fn, args, asyncio.get_running_loop().create_future())
        self._calls.append(call)
        self._wake.set()
        return await self._answer(call.future, lambda: self._drop(call))

    def _drop(self, call: _Call) -> None:
        if call in self._calls:  # not taken yet: its place goes back
            self._calls.remove(call)

    async def _answer(self, future: asyncio.Future, leave: Callable[[], Any]) -> Any:
        """`future`'s result within the deadline; whatever happens, its place in the queue is
        given back if it was not taken."""
        try:
            return await _answer_or_gone(future, self.timeout_s)
        except TimeoutError:
            raise Expired(
                f"not answered within request_timeout_s={self.timeout_s:g} s; the server is "
                "overloaded, retry shortly"
            ) from None
        finally:
            if not future.done():
                future.cancel()  # the request gave up or was cancelled: its client left
            leave()

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), with the scoring-call clock that health() reads."""
        self._scoring_since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self._scoring_since = None

    async def _on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the scoring thread, its time watched by health()."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._timed, fn, *args)

    def _take(self) -> tuple[list[_Job], int]:
        """The jobs of the next batch (at most max_batch_size histories; one job when batching
        is off), skipping those already answered (given up, or their client left)."""
        jobs, n = [], 0
        while self._jobs:
            size = len(self._jobs[0].histories)
            if jobs and (self.wait_s == 0 or n + size > self.max_batch_size):
                break
            job = self._jobs.popleft()
            self._queued -= size
            if job.future.done():
                continue
            jobs.append(job)
            n += size
        return jobs, n

    async def _run(self) -> None:
        while True:
            self._beat = time.monotonic()
            if not self._jobs and not self._calls:
                if self._stopping:
                    break
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # a beat every IDLE_BEAT_S idle
                    async with asyncio.timeout(IDLE_BEAT_S):  # no task, unlike wait_for
                        await self._wake.wait()
                continue
            if self._calls and (self._calls_turn or not self._jobs):
                self._calls_turn = False
                await self._run_call(self._calls.popleft())
            else:
                self._calls_turn = True
                await self._run_batch()

    async def _run_call(self, call: _Call) -> None:
        if call.future.done():  # its request gave up, or its client left, while it waited
            return
        try:
            out = await self._on_thread(call.fn, *call.args)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            if not call.future.done():
                call.future.set_exception(e)
            return
        if not call.future.done():
            call.future.set_result(out)

    async def _run_batch(self) -> None:
        if self.wait_s > 0:
            others = None if self.in_flight is None else self.in_flight() - 1
            if self._queued < self.max_batch_size and (
                others is None or others > len(self._jobs) - 1
            ):
                await asyncio.sleep(self.wait_s)
        jobs, _ = self._take()
        if not jobs:
            return
        loop = asyncio.get_running_loop()
        try:
            await self._on_thread(self._score_and_answer, jobs, loop)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the executor itself failed: fail the batch
            self._answer_jobs(jobs, [e] * len(jobs))

    def _score_and_answer(self, jobs: list[_Job], loop: asyncio.AbstractEventLoop) -> None:
        """On the scoring thread: the batch scored, its answers handed to the loop (the requests
        resume before this worker's own wake-up from the thread)."""
        loop.call_soon_threadsafe(self._answer_jobs, jobs, self._score(jobs))

    @staticmethod
    def _answer_jobs(jobs: list[_Job], outcomes: list) -> None:
        for job, out in zip(jobs, outcomes):
            if job.future.done():  # the client went away, or its deadline passed
                continue
            if isinstance(out, BaseException):
                job.future.set_exception(out)
            else:
                job.future.set_result(out)

    def _score(self, jobs: list[_Job]) -> list[list[Recommendation] | BaseException]:
        """On the scoring thread: one recommend_batch per group of alike jobs."""
        t0 = time.perf_counter()
        groups: dict[tuple, list[int]] = {}
        for j, job in enumerate(jobs):
            if not job.future.done():  # its request gave up while the batch waited for the thread
                groups.setdefault(job.key(), []).append(j)
        out: list[Any] = [None] * len(jobs)
        for members in groups.values():
            head = jobs[members[0]]
            histories = [h for j in members for h in jobs[j].histories]
            try:
                recs = head.model.recommender.recommend_batch(
                    histories,
                    head.k,
                    exclude_history=head.exclude_seen,
                    allow=head.allow,
                    deny=head.deny,
                    explain=head.explain,
                )
            except Exception as e:
                for j in members:
                    out[j] = e
                continue
            start = 0
            for j in members:
                n = len(jobs[j].histories)
                out[j] = recs[start : start + n]
                start += n
        if self.on_batch is not None and groups:
            members = [j for m in groups.values() for j in m]
            n = sum(len(jobs[j].histories) for j in members)
            self.on_batch(n, len(members), time.perf_counter() - t0)
        return out
