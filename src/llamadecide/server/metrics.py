"""Prometheus metrics, one registry per app (no module-level state)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/decisions", "/v1/systemone", "/v1/models",
          "/invocations", "/ping", "/health", "/metrics", "/"}


class Metrics:
    def __init__(self, depth) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("llamadecide_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.latency = Histogram("llamadecide_request_seconds", "Request latency", ["route"], registry=self.registry,
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.tokens = Counter("llamadecide_tokens", "Tokens processed", ["kind"], registry=self.registry)
        self.errors = Counter("llamadecide_errors", "Error responses by type", ["type"], registry=self.registry)
        self.answers = Counter("llamadecide_answers", "Decision answers", ["type"], registry=self.registry)
        self.queue = Gauge("llamadecide_queue_depth", "Requests waiting for or using the engine", registry=self.registry)
        self.queue.set_function(depth)

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
