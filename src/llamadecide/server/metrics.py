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
    "/v1/labels",
    "/v1/reviews",
    "/review",
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


class ReviewCollector(Collector):
    """Per profile, read at scrape time: reviews pending, labels held, and the audited precision of
    automatic decisions with its lower bound (`labels.audit`)."""

    def __init__(self, figures: Callable[[], dict | None]) -> None:
        self.figures = figures

    def collect(self) -> Iterator:
        from prometheus_client.core import GaugeMetricFamily

        found = self.figures()
        if found is None:
            return
        pending = GaugeMetricFamily("llamadecide_reviews_pending", "Queued items without a label", labels=["profile"])
        labels = CounterMetricFamily("llamadecide_labels", "Items people have labelled", labels=["profile"])
        for task, counts in sorted(found["counts"].items(), key=lambda kv: kv[0] or ""):
            pending.add_metric([task or ""], counts["pending"])
            labels.add_metric([task or ""], counts["labels"])
        yield pending
        yield labels
        audit = {
            "precision": "Audited precision of automatic decisions (the served version, weighted by chance)",
            "precision_lower_bound": "Its one-sided lower bound at the profile's confidence level",
            "labels": "Audited automatic decisions of the served version with a label",
            "labels_needed": "Audited labels before the bound could clear the target at all",
            "target": "The profile's target precision",
            "alert": "1 when the lower bound is below the target with enough audits to tell",
        }
        families = {
            key: GaugeMetricFamily(f"llamadecide_audit_{key}", text, labels=["profile"]) for key, text in audit.items()
        }
        for found_audit in found["audits"]:
            values = {
                "precision": found_audit.precision if found_audit.precision is not None else float("nan"),
                "precision_lower_bound": found_audit.lower_bound,
                "labels": found_audit.labels,
                "labels_needed": found_audit.needed,
                "target": found_audit.target,
                "alert": float(found_audit.state == "below_target"),
            }
            for key, value in values.items():
                families[key].add_metric([found_audit.profile], value)
        yield from families.values()


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
        self.decisions = Counter(
            "llamadecide_decisions",
            "Answers by profile (empty: none) and action (auto, escalate, none: no threshold applied)",
            ["profile", "action"],
            registry=self.registry,
        )
        self.registry.register(EngineCollector(engine_counters))

    def register_reviews(self, figures: Callable[[], dict | None]) -> None:
        self.registry.register(ReviewCollector(figures))

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
