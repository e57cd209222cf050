"""The metrics of an HTTP API (``fraud serve``): requests by route template, method and status, and their
durations by route."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

#: API request durations, seconds.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class ApiMetrics:
    """The metrics of an HTTP API (``fraud serve``): requests by route template, method and status, and
    their durations by route."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "fraud_api_requests", "Requests answered", ["route", "method", "status"], registry=self.registry
        )
        self.duration = Histogram(
            "fraud_api_request_duration_seconds",
            "Time to answer a request",
            ["route"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.duration.labels(route).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
