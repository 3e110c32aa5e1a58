"""The throughput suite, over HTTP: four client processes POST requests of 100 texts to /v1/embeddings back
to back (texts of 16..512 tokens, and texts of 50 tokens) to posy serving the BERT-base shape; real tokens/s
against HF transformers in process on the same texts. `--smoke`: the tiny shape on the CPU, seconds."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass

from benchmarks.baseline import Baseline, min_cosine
from benchmarks.checkpoints import words
from benchmarks.load import embed_over_http, run_clients
from benchmarks.records import RunContext, SuiteOutcome

SERVED_NAME = "bench"
MIN_COSINE = 0.999  # posy (bf16 on GPU) against the baseline in fp32: cosine divergence within 0.1%
NUM_SPECIAL_TOKENS = 2  # [CLS] and [SEP]
# case -> (min tokens, max tokens) of each text, special tokens included, drawn uniformly
VARIANTS = {"http-100x16-512": (16, 512), "http-100x50": (50, 50)}


@dataclass(frozen=True, slots=True)
class Plan:
    shape: str
    device: str
    dtype: str
    num_clients: int
    texts_per_request: int
    requests_per_client: int  # distinct bodies each client cycles through
    warmup_s: float
    duration_s: float | None  # the timed window, or ...
    num_requests: int | None  # ... this many timed requests per client


# on the H200: about 15 s of load per variant, HF's passes and the server's start: the suite in ~1.5 min
FULL = Plan("bert-base", "cuda", "bfloat16", 4, 100, 4, 3.0, 10.0, None)
SMOKE = Plan("smoke", "cpu", "float32", 2, 5, 2, 0.0, None, 3)


def request_texts(plan: Plan, min_tokens: int, max_tokens: int, rng: random.Random) -> list[list[list[str]]]:
    """[client][request] -> the request's texts."""

    def text() -> str:
        return words(rng.randint(min_tokens, max_tokens) - NUM_SPECIAL_TOKENS, rng)

    return [
        [[text() for _ in range(plan.texts_per_request)] for _ in range(plan.requests_per_client)]
        for _ in range(plan.num_clients)
    ]


def body(texts: list[str]) -> bytes:
    return json.dumps({"model": SERVED_NAME, "input": texts, "encoding_format": "base64"}).encode()


def baseline_tokens_per_s(baseline: Baseline, requests: list[list[str]], num_tokens: int, rounds: int):
    """HF in process over the same requests, one embed() call per request (tokenization included)."""
    baseline.embed(requests[0])  # warm-up
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for texts in requests:
            baseline.embed(texts)  # the vectors come back to the host, so the device is done
        rates.append(num_tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    from benchmarks.live_server import serve_random_bert

    smoke = getattr(options, "smoke", False)
    plan = SMOKE if smoke else FULL
    rng = random.Random(0)
    texts = {case: request_texts(plan, *lengths, rng) for case, lengths in VARIANTS.items()}
    setup = (options.suite, plan.shape, plan.device, plan.dtype, options.backend, SERVED_NAME)
    with serve_random_bert(*setup) as (url, baseline, context):
        records, failures = check_parity(url, baseline, texts, context)
        if failures:  # nothing is timed
            return SuiteOutcome(records, failures)
        baseline.to(getattr(torch, plan.dtype))
        rounds = 1 if smoke else options.rounds
        for case, clients in texts.items():
            measured, errors = measure(url, baseline, plan, case, clients, rounds, context)
            records += measured
            failures += errors
    return SuiteOutcome(records, failures)


def check_parity(url: str, baseline: Baseline, texts: dict[str, list], context: RunContext):
    """Each variant's first request: posy's vectors over HTTP are the fp32 baseline's, and its usage
    counts every token sent."""
    records, failures = [], []
    for case, clients in texts.items():
        vectors, num_tokens = embed_over_http(url, clients[0][0], SERVED_NAME)
        cosine = min_cosine(vectors, baseline.embed(clients[0][0]))
        records.append(context.record(case, "min_cosine_vs_fp32_reference", cosine, "cosine"))
        print(f"{case}: min cosine {cosine:.6f} against the fp32 baseline")
        if cosine < MIN_COSINE:
            failures.append(f"{case}: min cosine {cosine:.6f} < {MIN_COSINE}; nothing timed")
        expected = sum(map(len, baseline.encode(clients[0][0])))
        if num_tokens != expected:
            failures.append(f"{case}: usage.prompt_tokens {num_tokens} != the {expected} tokens sent")
    return records, failures


def measure(url: str, baseline: Baseline, plan: Plan, case: str, clients, rounds: int, context: RunContext):
    """HF's tokens/s on every request the clients send, then posy's under the clients' load."""
    requests = [request for client in clients for request in client]
    num_tokens = sum(map(len, baseline.encode([text for request in requests for text in request])))
    hf_rate = baseline_tokens_per_s(baseline, requests, num_tokens, rounds)
    load = run_clients(
        url, [[body(request) for request in client] for client in clients], warmup_s=plan.warmup_s,
        duration_s=plan.duration_s, num_requests=plan.num_requests,
    )  # fmt: skip
    records = [
        context.record(case, "tokens_per_s", load.tokens_per_s, "tokens/s", hf_rate),
        context.record(case, "errors", len(load.errors), "requests"),
    ]
    print(
        f"{case}: {plan.num_clients} clients x {plan.texts_per_request} texts a request: posy "
        f"{load.tokens_per_s / 1e3:.1f}k tokens/s ({load.num_requests} requests in {load.wall_s:.1f} s, "
        f"p50 {load.latency_ms(50):.1f} ms), HF in process {hf_rate / 1e3:.1f}k tokens/s, "
        f"ratio {load.tokens_per_s / hf_rate:.2f}x, {len(load.errors)} errors"
    )
    failures = (
        [f"{case}: {len(load.errors)} failed requests, the first: {load.errors[0]}"] if load.errors else []
    )
    return records, failures
