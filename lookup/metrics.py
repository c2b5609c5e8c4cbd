"""Prometheus metrics: sub-millisecond latency buckets, store errors, version age."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        )
