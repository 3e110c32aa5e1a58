"""Prometheus metrics of one server: requests, latency, queued tokens and batch sizes. A server of several
processes (gateway workers, engine replicas) runs prometheus_client's multiprocess mode: the environment
names a shared folder before prometheus_client is first imported, every process counts into its own
files there, and any gateway's /metrics sums them all, so it shows the whole server."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own switch

TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
SEQUENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        # this process's own view (model info, queued tokens: alike in every gateway)
        self.registry = CollectorRegistry()
        self.shared_dir = os.environ.get(MULTIPROCESS_DIR)
        # counters and histograms: in the shared files of a multi-process server, else here
        counted = None if self.shared_dir else self.registry
        self.requests = Counter(
            "posy_requests", "HTTP requests by route and status", ["route", "status"], registry=counted
        )
        self.latency = Histogram(
            "posy_request_duration_seconds", "HTTP request latency", ["route"], registry=counted
        )
        self.stages = Histogram(
            "posy_request_stage_seconds",
            "where requests' time went: tokenization, queue (waiting for a batch), inference (batch to rows)",
            ["route", "stage"],
            buckets=STAGE_BUCKETS,
            registry=counted,
        )
        # labelled children by label values: prometheus_client's labels() takes a lock and builds a key
        self._children: dict[tuple, object] = {}
        self.prompt_tokens = Counter(
            "posy_prompt_tokens", "tokens sent to the models", ["model"], registry=counted
        )
        self.batch_tokens, self.batch_sequences = batch_histograms(counted)
        self._queues = _QueueCollector()
        self.registry.register(self._queues)
        self.admission = AdmissionCollector()
        self.registry.register(self.admission)
        self.refusals = Counter(
            "posy_refusals",
            "requests refused for time or load, by route, status and why (queue_full, behind_deadline, "
            "tokenizer_behind, never_in_time, tokenizing_never_in_time, timeout, not_ready, engine_stopped)",
            ["route", "status", "reason"],
            registry=counted,
        )
        self.model_info = Info(
            "posy_model",
            "how each served model runs: architecture, task, device, dtype, attention backend, CUDA graphs",
            ["model"],
            registry=self.registry,
        )

    def observe_request(
        self, route: str, status: int, seconds: float, stages: tuple[tuple[str, float], ...] = ()
    ) -> None:
        self._child(self.requests, route, str(status)).inc()
        self._child(self.latency, route).observe(seconds)
        for stage, stage_seconds in stages:
            self._child(self.stages, route, stage).observe(stage_seconds)

    def count_refusal(self, route: str, status: int, reason: str) -> None:
        self._child(self.refusals, route, str(status), reason).inc()

    def count_prompt_tokens(self, model: str, num_tokens: int) -> None:
        self._child(self.prompt_tokens, model).inc(num_tokens)

    def _child(self, metric, *values: str):
        key = (metric, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def batch_observer(self, model: str) -> Callable[[int, int], None]:
        return _observer(self.batch_tokens, self.batch_sequences, model)

    def track_queue(self, model: str, queued_tokens: Callable[[], int]) -> None:
        self._queues.sources[model] = queued_tokens

    def render(self) -> bytes:
        if self.shared_dir is None:
            return generate_latest(self.registry)
        shared = CollectorRegistry()
        MultiProcessCollector(shared, path=self.shared_dir)
        return generate_latest(shared) + generate_latest(self.registry)


def batch_histograms(registry: CollectorRegistry | None) -> tuple[Histogram, Histogram]:
    """Tokens and sequences per engine batch, by model."""
    tokens = Histogram(
        "posy_batch_tokens", "tokens per engine batch", ["model"], buckets=TOKEN_BUCKETS, registry=registry
    )
    sequences = Histogram(
        "posy_batch_sequences",
        "sequences per engine batch",
        ["model"],
        buckets=SEQUENCE_BUCKETS,
        registry=registry,
    )
    return tokens, sequences


def replica_batch_observer(model: str) -> Callable[[int, int], None] | None:
    """In an engine replica process: its batches, counted into the shared files every gateway's /metrics
    reads; None where the server runs in one process (nothing would read them)."""
    if os.environ.get(MULTIPROCESS_DIR) is None:
        return None
    return _observer(*batch_histograms(None), model)


def _observer(tokens: Histogram, sequences: Histogram, model: str) -> Callable[[int, int], None]:
    tokens, sequences = tokens.labels(model=model), sequences.labels(model=model)

    def observe(num_tokens: int, num_seqs: int) -> None:
        tokens.observe(num_tokens)
        sequences.observe(num_seqs)

    return observe


class AdmissionCollector:
    """posy_admission_*: the estimates admission judges on (engine/admission.py), read when scraped, so
    that an estimate that does not come back shows: each model's engines' seconds a token and margin
    (one an engine replica, as this gateway last heard), its tokenizer threads' seconds a character and
    queued characters, and this gateway's answer reserve and event-loop lag."""

    def __init__(self) -> None:
        self.models: dict[str, Any] = {}  # name -> ServedModel: its engine (rates()) and encoder.pool
        self.gateway: Callable[[], tuple[float, float]] | None = None

    def track(self, name: str, model: Any) -> None:
        """A served model, read through when scraped (its engine as it is then)."""
        self.models[name] = model

    def collect(self) -> Iterator[GaugeMetricFamily]:
        per_token = GaugeMetricFamily(
            "posy_admission_seconds_per_token",
            "the engine's measured seconds a token, as admission judges queued work on it",
            labels=["model", "replica"],
        )
        margin = GaugeMetricFamily(
            "posy_admission_margin",
            "what admission stretches the engine's estimates by",
            labels=["model", "replica"],
        )
        for name, model in self.models.items():
            for replica, (seconds, stretch) in enumerate(model.engine.rates()):
                if seconds is not None:
                    per_token.add_metric([name, str(replica)], seconds)
                margin.add_metric([name, str(replica)], stretch)
        per_char = GaugeMetricFamily(
            "posy_admission_tokenizer_seconds_per_char",
            "the tokenizer threads' measured seconds a character",
            labels=["model"],
        )
        queued_chars = GaugeMetricFamily(
            "posy_admission_tokenizer_queued_chars",
            "characters queued on the tokenizer threads",
            labels=["model"],
        )
        for name, model in self.models.items():
            pool = model.encoder.pool
            if pool.seconds_per_char is not None:
                per_char.add_metric([name], pool.seconds_per_char)
            queued_chars.add_metric([name], pool.queued_chars)
        yield from (per_token, margin, per_char, queued_chars)
        if self.gateway is not None:
            reserve, lag = self.gateway()
            yield GaugeMetricFamily(
                "posy_admission_answer_reserve_seconds",
                "what this gateway keeps of a request's time for answering once its rows are back",
                value=reserve,
            )
            yield GaugeMetricFamily(
                "posy_admission_loop_lag_seconds",
                "this gateway's event loop's worst lag of the last second (a request's unread wait)",
                value=lag,
            )


class _QueueCollector:
    """posy_queued_tokens from each model's engine (or its replicas' last reports), read when scraped."""

    def __init__(self) -> None:
        self.sources: dict[str, Callable[[], int]] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "posy_queued_tokens", "tokens waiting in the engine queue", labels=["model"]
        )
        for model, queued_tokens in self.sources.items():
            family.add_metric([model], queued_tokens())
        yield family
