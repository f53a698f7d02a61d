"""Prometheus metrics of one app, in its own registry (several apps in one process, as in the
tests, do not collide): requests and latency by route and status (499: the client left first),
scoring batch sizes and seconds, the queues and requests in flight, refusals under load (by
reason: a full queue, a deadline, a slow client), reloads."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._by_label: dict = {}  # (route, status) -> its counter and histogram
        self.requests = Counter(
            "vaecf_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "vaecf_request_seconds",
            "HTTP request latency by route and status",
            ["route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_histories = Histogram(
            "vaecf_batch_histories",
            "histories per scoring call (micro-batch size)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "vaecf_batch_requests",
            "requests per scoring call",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.scoring = Histogram(
            "vaecf_scoring_seconds",
            "seconds per scoring call (one micro-batch)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queued = Gauge(
            "vaecf_queue_histories", "histories waiting for the scoring worker", registry=r
        )
        self.calls_queued = Gauge(
            "vaecf_queue_calls",
            "similar-items, search and user requests waiting for the scoring worker",
            registry=r,
        )
        self.in_flight = Gauge(
            "vaecf_requests_in_flight", "HTTP requests being handled", registry=r
        )
        self.rejected = Counter(
            "vaecf_rejected",
            "requests refused or dropped under load, by reason",
            ["reason"],
            registry=r,
        )
        self.reloads = Counter("vaecf_reloads", "model reloads by outcome", ["outcome"], registry=r)
        self.model_loaded = Gauge(
            "vaecf_model_loaded_timestamp_seconds", "when the serving model was loaded", registry=r
        )

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        children = self._by_label.get((route, status))
        if children is None:  # the labelled series, looked up once per (route, status)
            children = (self.requests.labels(route, str(status)),
                        self.latency.labels(route, str(status)))  # fmt: skip
            self._by_label[(route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_batch(self, histories: int, requests: int, seconds: float = 0.0) -> None:
        self.batch_histories.observe(histories)
        self.batch_requests.observe(requests)
        self.scoring.observe(seconds)

    def watch(self, queued, in_flight, calls_queued=lambda: 0) -> None:
        """Gauges read at scrape time: `queued()` histories, `in_flight()` requests,
        `calls_queued()` calls waiting."""
        self.queued.set_function(queued)
        self.in_flight.set_function(in_flight)
        self.calls_queued.set_function(calls_queued)

    def render(self) -> bytes:
        return generate_latest(self.registry)
