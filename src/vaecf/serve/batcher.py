"""MicroBatcher: concurrent recommendation requests gathered for a short, bounded wait and scored
as one batch by one worker thread.

A bounded queue sits in front of one scoring worker. The worker takes the first waiting job,
waits `wait_s` (unless `max_batch_size` histories are already queued, or the server is handling
no request beyond those in hand: then nobody could join), takes what has queued up to exactly
`max_batch_size` histories, and scores them in its single thread (the event loop stays free
to accept requests meanwhile; under load, requests queue while a batch is scored and form the
next batch). Jobs are grouped by what changes the answer (model, k, exclude_seen, allow, deny)
and each group is one `Recommender.recommend_batch` call, so a request's answer is exactly the
one it would get alone. `wait_s = 0` turns batching off: one request per scoring call. A request
that finds the server otherwise idle is scored at once on the event loop's thread.

Backpressure: a request that would take the queue past `max_queue` histories is refused at once
(`Overloaded`: the server answers 503 with Retry-After), and one not answered within
`timeout_s` gives up (`Expired`, 503). A request waiting in the queue, or for the worker
thread, watches its connection (`client_gone`, set per request by the server's middleware): if
its client leaves it gives up (`ClientGone`), and a job whose request gave up is dropped before
scoring. Nothing is watched on the fast path (scored inline): it has nothing to wait for.
`health()` reports a worker that stopped or whose scoring call has run longer than
`stuck_after_s`.
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

from vaecf.recommender import Recommendation
from vaecf.serve.reload import LoadedModel


class Stopped(RuntimeError):
    """The batcher is shutting down and takes no new work."""


class Overloaded(RuntimeError):
    """The queue is full: the request is refused at once (503 with Retry-After)."""


class Expired(RuntimeError):
    """The request was not answered within its deadline (503)."""


class ClientGone(RuntimeError):
    """The request's client closed its connection while the request waited."""


# per request: a coroutine function that returns when the request's client has disconnected
client_gone: ContextVar[Callable[[], Any] | None] = ContextVar("client_gone", default=None)


async def _answer_or_gone(future: asyncio.Future, timeout: float | None) -> Any:
    """`future`'s result, unless the request's client leaves first (ClientGone) or `timeout`
    seconds pass (TimeoutError)."""
    watch = client_gone.get()
    if watch is None:
        return await asyncio.wait_for(future, timeout)
    gone = asyncio.ensure_future(watch())
    try:
        await asyncio.wait((future, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if future.done():
        return future.result()
    if gone.done() and not gone.cancelled():
        raise ClientGone("the client closed the connection")
    raise TimeoutError


@dataclass(eq=False)  # a job is itself: found in the queue by identity
class _Job:
    model: LoadedModel
    histories: list[list]
    k: int
    exclude_seen: bool
    allow: tuple | None
    deny: tuple | None
    future: asyncio.Future

    def key(self) -> tuple:
        return (id(self.model), self.k, self.exclude_seen, self.allow, self.deny)


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
    ):
        self.wait_s = wait_s
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.stuck_after_s = stuck_after_s
        self.on_batch = on_batch  # (histories, requests, seconds) of every scoring call
        # requests the server is handling (queued or not yet): with none but those in hand and
        # queued, no one can join the batch and waiting would only add latency
        self.in_flight = in_flight
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="vaecf-score")
        self._jobs: deque[_Job] = deque()
        self._queued = 0  # histories waiting in the queue
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._busy = 0  # calls on the worker thread (or scoring inline)
        self._scoring_since: float | None = None  # when the running scoring call started
        self._beat = time.monotonic()  # the worker loop's last turn

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._stopping

    @property
    def queued(self) -> int:
        """Histories waiting for the worker."""
        return self._queued

    def health(self) -> str | None:
        """None when the worker is alive and not stuck, else what is wrong."""
        now = time.monotonic()
        if self._task is None or self._task.done():
            return "the scoring worker is not running"
        since = self._scoring_since
        if since is not None and now - since > self.stuck_after_s:
            return f"a scoring call has run for {now - since:.0f} s (stuck_after_s)"
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
    ) -> list[Recommendation]:
        """One Recommendation per history, from `model`, scored in some batch."""
        if not self.running:
            raise Stopped("the server is shutting down")
        job = _Job(
            model,
            [list(h) for h in histories],
            k,
            exclude_seen,
            None if allow is None else tuple(allow),
            None if deny is None else tuple(deny),
            asyncio.get_running_loop().create_future(),
        )
        # let requests that arrived with this one reach the server's count, then score at once
        # if none did and the worker is idle: nothing to gather, no hop to the thread (at
        # concurrency 1, ~0.6 ms of a 2 ms answer on 2 cores). Without the yield, requests
        # read in one go would each find themselves alone and be scored one by one, inline.
        await asyncio.sleep(0)
        if self._alone():
            self._busy += 1  # no await until it is given back: nothing else sees it
            try:
                out = self._timed(self._score, [job])[0]
            finally:
                self._busy -= 1
            if isinstance(out, BaseException):
                raise out
            return out
        n = len(job.histories)
        if self._queued + n > self.max_queue:
            raise Overloaded(
                f"the scoring queue is full ({self._queued} of max_queue={self.max_queue} "
                "histories waiting); retry shortly"
            )
        self._jobs.append(job)
        self._queued += n
        self._wake.set()
        try:
            return await _answer_or_gone(job.future, self.timeout_s)
        except TimeoutError:
            raise Expired(
                f"not answered within request_timeout_s={self.timeout_s:g} s; the server is "
                "overloaded, retry shortly"
            ) from None
        finally:
            if not job.future.done():
                job.future.cancel()  # the request was cancelled: its client left
            if job in self._jobs:  # not taken yet: its place goes back
                self._jobs.remove(job)
                self._queued -= n

    def _alone(self) -> bool:
        """Whether the server handles no request but the caller's and the worker is idle
        (anything arriving while the caller scores on the event loop's thread waits as it
        would for the worker)."""
        return (
            self.in_flight is not None
            and self.in_flight() == 1
            and not self._busy
            and not self._jobs
        )

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), with the scoring-call clock that health() reads."""
        self._scoring_since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self._scoring_since = None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the scoring thread (between batches). `_busy` is counted on the
        event loop's thread, from before the hand-over to after the answer."""
        self._busy += 1
        try:
            loop = asyncio.get_running_loop()
            work = loop.run_in_executor(self.executor, self._timed, fn, *args)
            try:
                return await _answer_or_gone(work, None)
            finally:
                work.cancel()  # not started yet: it never runs
        finally:
            self._busy -= 1

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
            if not self._jobs:
                if self._stopping:
                    break
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 1.0)  # a beat a second when idle
                continue
            if self.wait_s > 0:
                others = None if self.in_flight is None else self.in_flight() - 1
                if self._queued < self.max_batch_size and (
                    others is None or others > len(self._jobs) - 1
                ):
                    await asyncio.sleep(self.wait_s)
            jobs, _ = self._take()
            if not jobs:
                continue
            try:
                outcomes = await self.call(self._score, jobs)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # the executor itself failed: fail the batch
                outcomes = [e] * len(jobs)
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
