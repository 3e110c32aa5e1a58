"""The concurrency suite, over HTTP: 1, 2, 4, 8 and 16 client processes, each POSTing one text of 32..256
tokens a request to /v1/embeddings back to back for a fixed window, to posy serving the BERT-base shape;
p50 / p99 of the client's wall time (tokenization and network included) and throughput at each level.
`--smoke`: the tiny shape on the CPU, levels 1 and 2, seconds."""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass

from benchmarks.baseline import Baseline, min_cosine
from benchmarks.checkpoints import words
from benchmarks.load import LoadResult, embed_over_http, run_clients
from benchmarks.records import RunContext, SuiteOutcome

SERVED_NAME = "bench"
MIN_COSINE = 0.999  # posy (bf16 on GPU) against the baseline in fp32: cosine divergence within 0.1%
NUM_SPECIAL_TOKENS = 2  # [CLS] and [SEP]
MIN_TOKENS, MAX_TOKENS = 32, 256  # of each request's one text, special tokens included, drawn uniformly


@dataclass(frozen=True, slots=True)
class Plan:
    shape: str
    device: str
    dtype: str
    levels: tuple[int, ...]  # concurrent clients
    requests_per_client: int  # distinct bodies each client cycles through
    num_parity_texts: int
    warmup_s: float  # per level, untimed: the first hits of CUDA graph buckets capture them
    duration_s: float  # the timed window per level


# on the H200: about 12 s a level (client start, warm-up, window), the server's start; the suite in ~1.5 min
FULL = Plan("bert-base", "cuda", "bfloat16", (1, 2, 4, 8, 16), 512, 32, 2.0, 8.0)
SMOKE = Plan("smoke", "cpu", "float32", (1, 2), 32, 4, 0.3, 1.0)


def client_texts(plan: Plan, rng: random.Random) -> list[list[str]]:
    """[client][request] -> the request's one text; a level of n clients takes the first n clients."""

    def text() -> str:
        return words(rng.randint(MIN_TOKENS, MAX_TOKENS) - NUM_SPECIAL_TOKENS, rng)

    return [[text() for _ in range(plan.requests_per_client)] for _ in range(max(plan.levels))]


def body(text: str) -> bytes:
    return json.dumps({"model": SERVED_NAME, "input": text, "encoding_format": "base64"}).encode()


def run(options: argparse.Namespace) -> SuiteOutcome:
    from benchmarks.live_server import serve_random_bert

    plan = SMOKE if getattr(options, "smoke", False) else FULL
    texts = client_texts(plan, random.Random(0))
    bodies = [[body(text) for text in client] for client in texts]
    setup = (options.suite, plan.shape, plan.device, plan.dtype, options.backend, SERVED_NAME)
    with serve_random_bert(*setup) as (url, baseline, context):
        records, failures = check_parity(url, baseline, texts[0][: plan.num_parity_texts], context)
        if failures:  # nothing is timed
            return SuiteOutcome(records, failures)
        loads = {}
        for level in plan.levels:
            loads[level] = run_clients(
                url, bodies[:level], duration_s=plan.duration_s, warmup_s=plan.warmup_s
            )
            records += level_records(context, level, loads[level])
            if loads[level].errors:
                errors = loads[level].errors
                failures.append(f"clients-{level}: {len(errors)} failed requests, the first: {errors[0]}")
    records += ratio_records(context, loads[plan.levels[0]], loads[plan.levels[-1]], plan.levels)
    return SuiteOutcome(records, failures)


def check_parity(url: str, baseline: Baseline, texts: list[str], context: RunContext):
    """posy's vectors over HTTP, one text a request, are the fp32 baseline's, and usage counts every
    token sent."""
    vectors, num_tokens = embed_over_http(url, texts, SERVED_NAME, one_per_request=True)
    cosine = min_cosine(vectors, baseline.embed(texts))
    print(f"parity: min cosine {cosine:.6f} against the fp32 baseline over {len(texts)} requests")
    records = [context.record("clients-1", "min_cosine_vs_fp32_reference", cosine, "cosine")]
    failures = [f"min cosine {cosine:.6f} < {MIN_COSINE}; nothing timed"] if cosine < MIN_COSINE else []
    expected = sum(map(len, baseline.encode(texts)))
    if num_tokens != expected:
        failures.append(f"usage.prompt_tokens {num_tokens} != the {expected} tokens sent; nothing timed")
    return records, failures


def level_records(context: RunContext, level: int, load: LoadResult, case: str | None = None) -> list:
    case = case or f"clients-{level}"
    p50, p99 = load.latency_ms(50), load.latency_ms(99)
    print(
        f"{case}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, {load.requests_per_s:.1f} requests/s, "
        f"{load.tokens_per_s / 1e3:.1f}k tokens/s ({load.num_requests} requests in {load.wall_s:.1f} s, "
        f"{len(load.errors)} errors)"
    )
    return [
        context.record(case, "latency_p50_ms", p50, "ms"),
        context.record(case, "latency_p99_ms", p99, "ms"),
        context.record(case, "requests_per_s", load.requests_per_s, "requests/s"),
        context.record(case, "tokens_per_s", load.tokens_per_s, "tokens/s"),
        context.record(case, "errors", len(load.errors), "requests"),
    ]


def ratio_records(context: RunContext, first: LoadResult, last: LoadResult, levels: tuple[int, ...]) -> list:
    """The targets' ratios, most clients over one: throughput (>= 8x at 16) and p50 latency (<= 3x)."""
    case = f"clients-{levels[-1]}-vs-{levels[0]}"
    throughput = last.requests_per_s / first.requests_per_s if first.requests_per_s else 0.0
    latency = last.latency_ms(50) / first.latency_ms(50) if first.latency_ms(50) else 0.0
    print(f"{case}: throughput {throughput:.2f}x, p50 latency {latency:.2f}x")
    return [
        context.record(case, "throughput_ratio", throughput, "x"),
        context.record(case, "latency_p50_ratio", latency, "x"),
    ]
