"""Prometheus metrics: sub-millisecond latency buckets, store errors, version age, the query caches.

With several worker processes (ServiceSettings.workers), `precompute serve` sets
PROMETHEUS_MULTIPROC_DIR before the workers start: prometheus_client then keeps each process's
values in files there, and /metrics, whichever worker answers it, sums the counters and
histograms of all of them (gauges: the largest version age, the summed cache bytes of live
workers).
"""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "precompute_request_seconds",
            "Request latency inside the service",
            ["route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.store_errors = Counter(
            "precompute_store_errors_total", "Store calls that failed", ["output"], registry=self.registry
        )
        self.version_age = Gauge(
            "precompute_version_age_seconds",
            "Age of the version being served",
            ["output"],
            registry=self.registry,
            multiprocess_mode="max",
        )
        self.query_cache = Counter(
            "precompute_query_cache",
            "Lookups in the search path's caches (lookup/query_cache.py)",
            ["cache", "result"],
            registry=self.registry,
        )
        self.query_cache_bytes = Gauge(
            "precompute_query_cache_bytes",
            "Bytes held by each query cache",
            ["cache"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )

    def exposition(self) -> bytes:
        """The text /metrics answers: every worker's values when there are several."""
        if MULTIPROCESS_DIR not in os.environ:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)


UNMATCHED = "unmatched"
"""The route label of a request no route matched (a 404 or 405 from the router)."""


class RequestMetrics:
    """The app's outermost own layer (only Starlette's 500 page is outside it): every HTTP response's
    latency and status by route template. An exception no handler caught reaches the server as
    the 500 that Starlette's error middleware answers; it is counted here as that 500 on its way
    out, so a crash shows on the dashboard like any other answer."""

    def __init__(self, app: ASGIApp, latency: Histogram) -> None:
        self.app = app
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path_format", UNMATCHED)  # set by the router
            self.latency.labels(route, str(status)).observe(time.perf_counter() - start)
