"""Prometheus metrics, one registry per app (no module-level state)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

ROUTES = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/decisions",
    "/v1/systemone",
    "/v1/models",
    "/invocations",
    "/ping",
    "/health",
    "/metrics",
    "/",
}


ENGINE_COUNTERS = {  # Engine.counters key -> (metric name without _total, help)
    "decode_calls": ("llamadecide_engine_decode_calls", "llama_decode calls since the model loaded"),
    "rows": (
        "llamadecide_engine_rows",
        "Batch rows evaluated for requests since the model loaded (scratch rows apart)",
    ),
    "padding_rows": (
        "llamadecide_engine_padding_rows",
        "Scratch rows evaluated to pad small calls to a deterministic shape since the model loaded",
    ),
    "projections_skipped": (
        "llamadecide_engine_projections_skipped",
        "llama_decode calls that read hidden states and no logits, stopped before the vocabulary projection",
    ),
    "full_depth_rows": (
        "llamadecide_engine_full_depth_rows",
        "Batch rows for requests weighted by the share of the model's blocks their call ran (a head on a middle "
        "block stops its call there)",
    ),
}


class EngineCollector(Collector):
    """The engine's own work counters, read at scrape time (the engine keeps them anyway)."""

    def __init__(self, counters: Callable[[], Mapping[str, int] | None]) -> None:
        self.counters = counters

    def collect(self) -> Iterator[CounterMetricFamily]:
        values = self.counters() or {}
        for key, (name, text) in ENGINE_COUNTERS.items():
            yield CounterMetricFamily(name, text, value=values.get(key, 0))


class Metrics:
    def __init__(
        self,
        depth: Callable[[], int],
        engine_counters: Callable[[], Mapping[str, int] | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("llamadecide_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.latency = Histogram(
            "llamadecide_request_seconds",
            "Request latency",
            ["route"],
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tokens = Counter("llamadecide_tokens", "Tokens processed", ["kind"], registry=self.registry)
        self.errors = Counter("llamadecide_errors", "Error responses by type", ["type"], registry=self.registry)
        self.answers = Counter("llamadecide_answers", "Decision answers", ["type"], registry=self.registry)
        self.queue = Gauge(
            "llamadecide_queue_depth", "Requests waiting for or using the engine", registry=self.registry
        )
        self.queue.set_function(depth)
        self.batch_decisions = Histogram(
            "llamadecide_engine_batch_decisions",
            "Decisions served by one shared engine run",
            registry=self.registry,
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
        )
        self.registry.register(EngineCollector(engine_counters))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"
        began = time.perf_counter()
        status = {"code": 500}

        async def watch(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - began)
            if status["code"] >= 400:
                self.metrics.errors.labels(str(status["code"])).inc()
