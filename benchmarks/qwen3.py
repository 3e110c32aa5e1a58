"""The qwen3 suite (CUDA): posy's engine against HF transformers on the same Qwen3-0.6B-shaped random
weights, bf16: the causal embedder at batch 1 x 128 tokens and on 100 mixed texts of 16..512 tokens.
(The Qwen3-Reranker shape is timed by the scoring suite, one query with 5, 25 and 50 documents.)
`--smoke` runs a tiny shape on the CPU in seconds, so that the suite's code is exercised by the tests."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from benchmarks.baseline import Baseline, min_cosine
from benchmarks.checkpoints import save_qwen3
from benchmarks.mixed import engine_config, measure, mixed_sequences, random_sequences
from benchmarks.records import RunContext, SuiteOutcome, engine_backend
from benchmarks.timing import timed

MODEL = "qwen3-0.6b-shape (random weights)"
MIN_COSINE = 0.999  # posy in bf16 against the reference in fp32 ("same vector", DESIGN.md)
HF_BATCH_SIZE = 16


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    from engine.batch import pack
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model

    smoke = getattr(options, "smoke", False)
    device, shape = ("cpu", "smoke") if smoke else ("cuda", "qwen3-0.6b")
    dtype = torch.float32 if smoke else torch.bfloat16
    rounds = 1 if smoke else options.rounds

    checkpoint = save_qwen3(Path(tempfile.mkdtemp()), shape)
    baseline = Baseline(checkpoint, device, dtype, batch_size=HF_BATCH_SIZE)
    engine = build_engine(
        resolve_model(str(checkpoint.folder)), engine_config(device, dtype, options.backend)
    )
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    context = RunContext(suite=options.suite, model=MODEL, gpu=gpu, backend=engine_backend(engine))
    loop = asyncio.new_event_loop()
    records, failures = [], []
    vocab_size = checkpoint.reference.config.vocab_size
    single = random_sequences([128], vocab_size, seed=1)
    mixed = mixed_sequences(vocab_size)
    step = engine.runner.step
    try:
        # 1. batch 1 x 128 tokens: request to pooled vector on the host
        for _ in range(3):  # eager, capture, replay
            step(pack(single)).result()
        posy = timed(lambda: step(pack(single)).result(), rounds * 100, device)
        timed(lambda: baseline.embed_ids(single), 5, device)
        hf = timed(lambda: baseline.embed_ids(single), rounds * 20, device)
        posy_p50, hf_p50 = 1000 * statistics.median(posy), 1000 * statistics.median(hf)
        records.append(context.record("qwen3-batch1x128", "latency_p50_ms", posy_p50, "ms", hf_p50))
        print(f"qwen3 batch 1x128: posy p50 {posy_p50:.3f} ms, HF eager {hf_p50:.3f} ms")

        # 2. 100 mixed texts of 16..512 tokens: real tokens per second
        rates = measure(engine, baseline, mixed, rounds, device, loop)
        records.append(
            context.record("qwen3-mixed100", "real_tokens_per_s", rates.posy, "tokens/s", rates.hf)
        )
        print(f"qwen3 mixed 100: posy {rates.posy / 1e3:.0f}k tokens/s, HF {rates.hf / 1e3:.0f}k")

        # parity, against HF in fp32 on the same weights
        baseline.to(torch.float32)
        cosine = min(
            min_cosine(rates.vectors, baseline.embed_ids(mixed)),
            min_cosine(step(pack(single)).result(), baseline.embed_ids(single)),
        )
        records.append(context.record("qwen3-mixed100", "min_cosine_vs_fp32_reference", cosine, "cosine"))
        if cosine < MIN_COSINE:
            failures.append(f"embedder min cosine {cosine:.5f} < {MIN_COSINE}")
    finally:
        engine.stop()
        loop.close()
    return SuiteOutcome(records, failures)
