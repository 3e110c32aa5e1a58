"""The seed suite: the table of the stack posy follows (Perplexity's "Fast Embeddings on GPUs": one H200,
bf16, against vLLM 0.22) measured on posy in Perplexity's conditions, on its models' shapes with random
weights and real-size tokenizers (benchmarks/seed_models.py). Each case times posy through HTTP as a client
reaches it, in the default configuration; posy's engine alone (the ceiling); and HF transformers on the same
weights; Perplexity's and vLLM's figures are printed beside (benchmarks/seed_table.py). An HTTP record's
baseline is Perplexity's figure where it published one (ratio < 1: faster for a latency), and each target of
issue 58 is recorded as met (1) or not (0).

- latency: pre-tokenized, batch 1, sequential, 128 and 4,096 tokens (BGE-M3, pplx-embed-v1-0.6b), over
  HTTP with --accept-token-ids from one raw keep-alive client.
- throughput: requests of 100 texts from 4 client processes back to back, 512 tokens (both models), 1,024
  and 4,096 (pplx-embed): embeddings a second, tokenization included.
- concurrency: pplx-embed, one 512-token text a request, 1 to 16 concurrent clients: p50 and p99.
- scoring (benchmarks/seed_scoring.py): a query and 5, 25 and 50 documents of 512 tokens a pair.

`--parts` picks some of them, `--shapes` some of the models; `--smoke`: tiny shapes and word tokenizers on
the CPU, seconds: a code check.
Infinity is a side where it is installed and serves the model; it is said where it is not."""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import importlib.util
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.baseline import Baseline, min_cosine
from benchmarks.load import STAGE_HEADERS, LoadResult, run_clients
from benchmarks.records import Record, RunContext, SuiteOutcome
from benchmarks.seed_models import BY_NAME, SeedModel, real_shape
from benchmarks.seed_table import PUBLISHED, TARGETS, anchor_note
from benchmarks.seed_texts import TextMaker
from benchmarks.seed_tokenizers import load_sentences
from benchmarks.timing import timed

PARTS = ("latency", "throughput", "concurrency", "scoring")
# the suite's seed tokenizers (benchmarks/seed_tokenizers.py), carried to the GPU machine in .gpu/
TOKENIZERS_ENV = "POSY_SEED_TOKENIZERS"
DEFAULT_TOKENIZERS = Path(".gpu/seed-tokenizers")
SERVED_NAME = "bench"
MIN_REQUESTS_A_CLIENT = 3  # a throughput window holds at least this many of each client's requests
MIN_COSINE = 0.999  # posy in bf16 against the reference in fp32: cosine divergence within 0.1%


@dataclass(frozen=True, slots=True)
class Plan:
    latency_lengths: tuple[int, ...]
    throughput_lengths: dict[str, tuple[int, ...]]  # model -> lengths
    concurrency_levels: tuple[int, ...]
    concurrency_length: int
    texts_per_request: int
    num_clients: int
    repeats: int  # b1 requests timed a side
    window_s: float  # each HTTP load's timed window
    warmup_s: float


# on an H100: each model's HTTP cases, engine and HF sides and server start in about 3 to 4 minutes
FULL = Plan(
    (128, 4096), {"bge-m3": (512,), "pplx-embed-v1-0.6b": (512, 1024, 4096)}, (1, 2, 4, 8, 16), 512, 100, 4,
    500, 5.0, 1.0,
)  # fmt: skip
SMOKE = Plan((16, 64), {"bge-m3": (32,), "pplx-embed-v1-0.6b": (32, 64)}, (1, 2), 32, 5, 2, 10, 0.5, 0.1)


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    from benchmarks.seed_scoring import measure_scoring

    smoke = getattr(options, "smoke", False)
    plan = SMOKE if smoke else FULL
    parts = tuple(getattr(options, "parts", None).split(",")) if getattr(options, "parts", None) else PARTS
    tokenizers = None if smoke else Path(os.environ.get(TOKENIZERS_ENV, DEFAULT_TOKENIZERS))
    device = "cpu" if smoke else "cuda"
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    shapes = getattr(options, "shapes", None)
    names = shapes.split(",") if shapes else list(BY_NAME)
    say_infinity()
    # prose where the real tokenizers are: a smoke run's word tokenizers know none of its words
    sentences = load_sentences(tokenizers) if tokenizers is not None else []
    print(f"texts: {TextMaker.describe(sentences)}")
    outcome = SuiteOutcome([], [])
    embedder_parts = [part for part in parts if part != "scoring"]
    for name in (
        [name for name in ("bge-m3", "pplx-embed-v1-0.6b") if name in names] if embedder_parts else ()
    ):
        with tempfile.TemporaryDirectory() as folder:
            model = BY_NAME[name]
            checkpoint = model.save(Path(folder), real_shape(smoke, model.shape), tokenizers, device)
            side = EmbedderSide(options, model, checkpoint, plan, device, gpu, smoke, sentences)
            side.measure(embedder_parts)
            outcome.records += side.records
            outcome.failures += side.failures
    if "scoring" in parts:
        for name in [name for name in ("bge-reranker-v2-m3", "qwen3-reranker-0.6b") if name in names]:
            records, failures = measure_scoring(
                options, BY_NAME[name], tokenizers, device, gpu, smoke, sentences
            )
            outcome.records += records
            outcome.failures += failures
    return outcome


def say_infinity() -> None:
    if importlib.util.find_spec("infinity_emb") is None:
        print("Infinity: not installed on this machine; no Infinity side")


class EmbedderSide:
    """One embedder's cases: its engine alone and HF in process, then one `posy serve` for HTTP."""

    def __init__(
        self, options, model: SeedModel, checkpoint, plan: Plan, device: str, gpu, smoke: bool, sentences
    ):
        import torch

        self.options, self.model, self.checkpoint, self.plan = options, model, checkpoint, plan
        self.device, self.smoke = device, smoke
        self.dtype = torch.float32 if smoke else torch.bfloat16
        self.dtype_name = "float32" if smoke else "bfloat16"
        model_name = f"{model.name} shape (random weights)"
        self.context = RunContext(suite=options.suite, model=model_name, gpu=gpu, backend="unknown")
        self.records: list[Record] = []
        self.failures: list[str] = []
        self.engine_rates: dict[int, float] = {}  # length -> the engine's embeddings a second
        self.baseline = Baseline(checkpoint, device, self.dtype)
        tokenizer = self.baseline.tokenizer
        num_specials = (
            tokenizer.post_processor.num_special_tokens_to_add(False) if tokenizer.post_processor else 0
        )
        self.texts = TextMaker(tokenizer, num_specials, random.Random(0), sentences)

    # the sides
    def measure(self, parts: list[str]) -> None:
        import torch

        from engine.build import build_engine
        from engine.checkpoint.resolve import resolve_model
        from engine.config import sized_for

        spec = resolve_model(str(self.checkpoint.folder))
        # as `posy serve` sizes it for this model (its batch budget at least its window)
        cuda_graphs = "off" if self.smoke else "lazy"
        config = sized_for(
            spec.max_seq_length, self.device, self.dtype_name, self.options.backend, cuda_graphs
        )
        engine = build_engine(spec, config)
        self.context = dataclasses.replace(self.context, backend=engine.attention_backend)
        try:
            if "latency" in parts:
                for length in self.plan.latency_lengths:
                    self.latency_engine(engine, length)
            if "throughput" in parts:
                for length in self.plan.throughput_lengths[self.model.name]:
                    self.throughput_engine(engine, length)
        finally:
            engine.stop()
            del engine
            if self.device == "cuda":
                torch.cuda.empty_cache()
        self.http(parts)

    def latency_engine(self, engine, length: int) -> None:
        from engine.batch import pack

        ids = [self.exact_ids(length)]
        for _ in range(3):  # eager, capture, replay
            vector = engine.runner.step(pack(ids)).result()
        cosine = self.parity(f"b1-{length}-engine", np.asarray(vector), ids)
        if cosine is None:
            return
        posy = timed(lambda: engine.runner.step(pack(ids)).result(), self.plan.repeats, self.device)
        hf = timed(lambda: self.baseline.embed_ids(ids), max(5, self.plan.repeats // 20), self.device)
        case = f"{self.model.name}-b1-{length}-engine"
        p50, hf_p50 = _ms(posy, 50), _ms(hf, 50)
        self.records += [
            self.context.record(case, "latency_p50_ms", p50, "ms", hf_p50),
            self.context.record(case, "latency_p99_ms", _ms(posy, 99), "ms", _ms(hf, 99)),
        ]
        print(f"{case}: engine p50 {p50:.3f} ms, p99 {_ms(posy, 99):.3f}; HF p50 {hf_p50:.3f} ms")

    def throughput_engine(self, engine, length: int) -> None:
        """Requests of texts_per_request sequences from num_clients streams at once, for the window."""
        requests = [[self.exact_ids(length) for _ in range(self.plan.texts_per_request)] for _ in range(4)]

        async def streams() -> tuple[int, float]:
            done, stop_at = 0, time.perf_counter() + self.plan.window_s

            async def stream(index: int) -> None:
                nonlocal done
                while time.perf_counter() < stop_at:
                    await engine.run(requests[index % len(requests)])
                    done += self.plan.texts_per_request

            await asyncio.gather(*(stream(index) for index in range(2)))  # warm-up: the graphs' captures
            done, stop_at = 0, time.perf_counter() + self.plan.window_s
            started = time.perf_counter()
            await asyncio.gather(*(stream(index) for index in range(self.plan.num_clients)))
            return done, time.perf_counter() - started

        done, wall = asyncio.run(streams())
        texts = [[self.texts.text(length) for _ in range(self.plan.texts_per_request)] for _ in range(2)]
        self.baseline.embed(texts[0])  # warm-up
        started = time.perf_counter()
        for batch in texts:
            self.baseline.embed(batch)
        hf_rate = 2 * self.plan.texts_per_request / (time.perf_counter() - started)
        case = f"{self.model.name}-{self.plan.texts_per_request}x{length}-engine"
        rate = done / wall
        self.engine_rates[length] = rate
        self.records.append(self.context.record(case, "embeddings_per_s", rate, "embeddings/s", hf_rate))
        print(
            f"{case}: engine {rate:.1f} embeddings/s from {self.plan.num_clients} streams; HF {hf_rate:.1f}"
        )

    def http(self, parts: list[str]) -> None:
        from benchmarks.live_server import serve, served_backend

        flags = (
            "--device", self.device, "--dtype", self.dtype_name, "--attention-backend", self.options.backend,
            "--served-model-name", SERVED_NAME, "--accept-token-ids",
        )  # fmt: skip
        with serve(self.checkpoint.folder, *flags) as url:
            self.context = dataclasses.replace(self.context, backend=served_backend(url))
            if not self.http_parity(url):
                return
            if "latency" in parts:
                for length in self.plan.latency_lengths:
                    body = self.body([self.exact_ids(length)])
                    load = run_clients(
                        url, [[body]], duration_s=self.plan.window_s, warmup_s=self.plan.warmup_s
                    )
                    self.http_records(f"{self.model.name}-b1-{length}", load)
            if "throughput" in parts:
                for length in self.plan.throughput_lengths[self.model.name]:
                    self.http_throughput(url, length)
            if "concurrency" in parts and self.model.name == "pplx-embed-v1-0.6b":
                bodies = [[self.body(self.texts.text(self.plan.concurrency_length)) for _ in range(64)]
                          for _ in range(max(self.plan.concurrency_levels))]  # fmt: skip
                for level in self.plan.concurrency_levels:
                    load = run_clients(
                        url, bodies[:level], duration_s=self.plan.window_s, warmup_s=self.plan.warmup_s
                    )
                    self.http_records(f"{self.model.name}-clients-{level}", load)
                # the most clients again, on a server that has met their batches once (its CUDA graphs
                # captured): what of the first pass's tail was the first meeting
                level = max(self.plan.concurrency_levels)
                load = run_clients(url, bodies[:level], duration_s=self.plan.window_s, warmup_s=0.0)
                self.http_records(f"{self.model.name}-clients-{level}-second-pass", load)

    def http_throughput(self, url: str, length: int) -> None:
        # each request 100 of a pool of 200 texts, drawn anew (the server caches nothing)
        pool = self.texts.texts(length, 2 * self.plan.texts_per_request)
        draw = random.Random(length)
        bodies = [
            [self.body(draw.sample(pool, self.plan.texts_per_request)) for _ in range(2)]
            for _ in range(self.plan.num_clients)
        ]
        # at least MIN_REQUESTS_A_CLIENT timed requests a client, as long as the engine takes for them
        engine_rate = self.engine_rates.get(length)
        request_s = self.plan.texts_per_request * self.plan.num_clients / engine_rate if engine_rate else 0.0
        window = max(self.plan.window_s, MIN_REQUESTS_A_CLIENT * request_s)
        load = run_clients(url, bodies, duration_s=window, warmup_s=self.plan.warmup_s)
        case = f"{self.model.name}-{self.plan.texts_per_request}x{length}"
        rate = load.requests_per_s * self.plan.texts_per_request
        self.record_http(case, "embeddings_per_s", rate, "embeddings/s")
        self.record_http(case, "errors", len(load.errors), "requests")
        tokens = load.num_tokens / max(1, load.num_requests * self.plan.texts_per_request)
        p50 = load.latency_ms(50)
        note = anchor_note(case, "embeddings_per_s")
        # where a request's time went, as the server's timing headers say (p50s)
        stages = ", ".join(
            f"{stage} {value:.1f}" for stage in STAGE_HEADERS if (value := load.stage_ms(stage)) is not None
        )
        print(
            f"{case}: HTTP {rate:.1f} embeddings/s ({tokens:.0f} tokens a text), p50 {p50:.1f} ms "
            f"(server: {stages} ms){note}"
        )

    def http_records(self, case: str, load: LoadResult) -> None:
        p50, p99 = load.latency_ms(50), load.latency_ms(99)
        self.record_http(case, "latency_p50_ms", p50, "ms")
        self.record_http(case, "latency_p99_ms", p99, "ms")
        self.record_http(case, "errors", len(load.errors), "requests")
        total, inference = load.stage_ms("total"), load.stage_ms("inference")
        if total is not None and inference is not None:
            self.record_http(case, "server_overhead_p50_ms", total - inference, "ms")
        print(f"{case}: HTTP p50 {p50:.3f} ms{anchor_note(case, 'latency_p50_ms')}, p99 {p99:.3f} ms"
              f"{anchor_note(case, 'latency_p99_ms')}; server total {total} ms, inference {inference} ms; "
              f"{load.requests_per_s:.0f} requests/s, {len(load.errors)} errors")  # fmt: skip
        if load.errors:
            self.failures.append(f"{case}: {len(load.errors)} failed requests, the first: {load.errors[0]}")

    def record_http(self, case: str, metric: str, value: float, unit: str) -> None:
        published = PUBLISHED.get((case, metric))
        self.records.append(
            self.context.record(case, metric, value, unit, published and published.perplexity)
        )
        target = TARGETS.get((case, metric))
        if target is not None and not self.smoke:
            met = target.met(value)
            self.records.append(
                self.context.record(case, f"{metric}_target_met", float(met), "bool", target.value)
            )
            print(f"{case}: {metric} {value:.3f} against the target {'<=' if target.at_most else '>='} "
                  f"{target.value:g}: {'met' if met else 'MISSED'}")  # fmt: skip

    # inputs and checks
    def exact_ids(self, length: int) -> list[int]:
        """A tokenized text of exactly `length` tokens, special tokens included (its middle cut or filled)."""
        ids = self.baseline.encode([self.texts.text(length)])[0]
        while len(ids) < length:
            ids = ids[:-1] + ids[1 : 1 + length - len(ids)] + ids[-1:] if len(ids) > 2 else ids * 2
        return ids[: length - 1] + ids[-1:] if len(ids) > length else ids

    def body(self, inputs) -> bytes:
        return json.dumps(
            {"model": SERVED_NAME, "input": inputs, "encoding_format": self.model.http_encoding}
        ).encode()

    def parity(self, case: str, vectors: np.ndarray, ids: list[list[int]]) -> float | None:
        import torch

        reference = self.baseline.to(torch.float32).embed_ids(ids)
        self.baseline.to(self.dtype)
        cosine = min_cosine(vectors, reference)
        self.records.append(self.context.record(f"{self.model.name}-{case}", "min_cosine_vs_fp32_reference",
                                                cosine, "cosine"))  # fmt: skip
        if cosine < MIN_COSINE:
            self.failures.append(
                f"{self.model.name}-{case}: min cosine {cosine:.5f} < {MIN_COSINE}: not timed"
            )
            print(self.failures[-1])
            return None
        return cosine

    def http_parity(self, url: str) -> bool:
        """posy's vectors over HTTP (floats) are the fp32 reference's, and usage counts every token."""
        import httpx

        texts = self.texts.texts(self.plan.concurrency_length, 4)
        response = httpx.post(url + "/v1/embeddings", json={"model": SERVED_NAME, "input": texts,
                              "encoding_format": "base64"}, timeout=120.0, trust_env=False)  # fmt: skip
        if response.status_code != 200:
            self.failures.append(f"{self.model.name}: HTTP {response.status_code}: {response.text[:300]}")
            return False
        reply = response.json()
        vectors = np.stack(
            [np.frombuffer(base64.b64decode(item["embedding"]), "<f4") for item in reply["data"]]
        )
        ids = self.baseline.encode(texts)
        cosine = self.parity("http", vectors, ids)
        if reply["usage"]["prompt_tokens"] != sum(map(len, ids)):
            self.failures.append(
                f"{self.model.name}: usage {reply['usage']['prompt_tokens']} != {sum(map(len, ids))}"
            )
            return False
        return cosine is not None


def _ms(samples: list[float], percentile: float) -> float:
    return 1000 * float(np.percentile(samples, percentile))
