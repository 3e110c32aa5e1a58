"""Prometheus metrics of one server: requests, latency, queued tokens and batch sizes."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
SEQUENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "posy_requests", "HTTP requests by route and status", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "posy_request_duration_seconds", "HTTP request latency", ["route"], registry=self.registry
        )
        self.prompt_tokens = Counter(
            "posy_prompt_tokens", "tokens sent to the models", ["model"], registry=self.registry
        )
        self.queued_tokens = Gauge(
            "posy_queued_tokens", "tokens waiting in the engine queue", ["model"], registry=self.registry
        )
        self.batch_tokens = Histogram(
            "posy_batch_tokens",
            "tokens per engine batch",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.batch_sequences = Histogram(
            "posy_batch_sequences",
            "sequences per engine batch",
            ["model"],
            buckets=SEQUENCE_BUCKETS,
            registry=self.registry,
        )

        self.model_info = Info(
            "posy_model",
            "how each served model runs: architecture, task, device, dtype, attention backend, CUDA graphs",
            ["model"],
            registry=self.registry,
        )

    def observe_request(self, route: str, status: int, seconds: float | None) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        if seconds is not None:
            self.latency.labels(route=route).observe(seconds)

    def batch_observer(self, model: str) -> Callable[[int, int], None]:
        tokens = self.batch_tokens.labels(model=model)
        sequences = self.batch_sequences.labels(model=model)

        def observe(num_tokens: int, num_seqs: int) -> None:
            tokens.observe(num_tokens)
            sequences.observe(num_seqs)

        return observe

    def track_queue(self, model: str, queued_tokens: Callable[[], int]) -> None:
        self.queued_tokens.labels(model=model).set_function(queued_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
