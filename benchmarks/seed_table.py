"""Perplexity's published table ("Fast Embeddings on GPUs", one H200, bf16, against vLLM 0.22; figures as
read off its charts) and issue 58's targets, by the seed suite's case and metric: anchors printed beside
posy's figures and the baselines of its HTTP records, and the targets recorded as met or not."""

from __future__ import annotations

from dataclasses import dataclass

ANCHOR_CARD = "H200"  # Perplexity's card


@dataclass(frozen=True, slots=True)
class Published:
    perplexity: float
    vllm: float | None


@dataclass(frozen=True, slots=True)
class Target:
    value: float
    at_most: bool  # a latency's bound; else a throughput's floor

    def met(self, measured: float) -> bool:
        return measured <= self.value if self.at_most else measured >= self.value


PUBLISHED = {
    ("bge-m3-b1-128", "latency_p50_ms"): Published(1.53, 4.60),
    ("bge-m3-b1-128", "latency_p99_ms"): Published(1.67, 7.96),
    ("pplx-embed-v1-0.6b-b1-128", "latency_p50_ms"): Published(1.88, 4.94),
    ("bge-m3-b1-4096", "latency_p50_ms"): Published(9.57, 11.71),
    ("pplx-embed-v1-0.6b-b1-4096", "latency_p50_ms"): Published(15.41, 16.15),
    ("bge-m3-100x512", "embeddings_per_s"): Published(1499.3, 1342.2),
    ("pplx-embed-v1-0.6b-100x512", "embeddings_per_s"): Published(926.7, 902.3),
    ("pplx-embed-v1-0.6b-100x1024", "embeddings_per_s"): Published(422.8, 423.3),
    ("pplx-embed-v1-0.6b-100x4096", "embeddings_per_s"): Published(72.2, 73.5),
    ("pplx-embed-v1-0.6b-clients-16", "latency_p50_ms"): Published(25.0, None),
    ("pplx-embed-v1-0.6b-clients-16", "latency_p99_ms"): Published(35.0, 50.0),
}
TARGETS = {
    ("bge-m3-b1-128", "latency_p50_ms"): Target(1.2, True),
    ("bge-m3-b1-128", "latency_p99_ms"): Target(1.5, True),
    ("pplx-embed-v1-0.6b-b1-128", "latency_p50_ms"): Target(1.5, True),
    ("bge-m3-b1-4096", "latency_p50_ms"): Target(9.0, True),
    ("pplx-embed-v1-0.6b-b1-4096", "latency_p50_ms"): Target(14.0, True),
    ("bge-m3-100x512", "embeddings_per_s"): Target(1800.0, False),
    ("pplx-embed-v1-0.6b-100x512", "embeddings_per_s"): Target(1100.0, False),
    ("pplx-embed-v1-0.6b-clients-16", "latency_p99_ms"): Target(25.0, True),
    ("bge-reranker-v2-m3-50x512", "compute_floor_ratio"): Target(1.3, True),
}


def anchor_note(case: str, metric: str) -> str:
    """ ", Perplexity 1.53 (vLLM 4.60) on an H200" where published, else ""."""
    published = PUBLISHED.get((case, metric))
    if published is None:
        return ""
    vllm = f" (vLLM {published.vllm:g})" if published.vllm is not None else ""
    return f", Perplexity {published.perplexity:g}{vllm} on an {ANCHOR_CARD}"
