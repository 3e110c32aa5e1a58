"""The fp8 suite (CUDA): --quantization fp8 against bf16 on the same random weights, in one run, on issue
32's targets:
- BERT-base embedder, 50-token inputs at saturation (256 requests of 64 texts): tokens/s, fp8 >= 3.4M;
- BERT-base cross-encoder, 50 pairs of 512 tokens through rerank: p50, fp8 <= 8.0 ms;
- Qwen3-Reranker-0.6B judge, 50 pairs of 512 tokens: p50, fp8 <= 38 ms;
- Qwen2-1.5B embedder, 100 mixed texts of 16..512 tokens: tokens/s against HF's, fp8 >= 3x;
- BERT-base embedder, one text of 128 tokens (small M, no target): p50 of each.
Each case records bf16's figure beside fp8's (the baseline column: HF's for Qwen2), and fp8's drift from
bf16 (min cosine of the vectors; the largest score difference). `--smoke`: tiny shapes on the CPU, where
FP8 is emulated: a code check, no measurement."""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.baseline import Baseline, min_cosine
from benchmarks.checkpoints import save_bert, save_qwen3, words
from benchmarks.layouts import QWEN2, save_layout
from benchmarks.mixed import MAX_BATCH_TOKENS, NUM_TEXTS, mixed_sequences
from benchmarks.records import RunContext, SuiteOutcome, engine_backend
from benchmarks.scoring import rerank_model
from benchmarks.timing import timed

MODEL = "issue 32 shapes (random weights)"
TARGETS = {  # case -> (metric, fp8's target, True where higher is better)
    "saturation-50tok": ("tokens_per_s", 3.4e6, True),
    "cross-encoder-50x512": ("latency_p50_ms", 8.0, False),
    "qwen3-reranker-50x512": ("latency_p50_ms", 38.0, False),
    "qwen2-1.5b-mixed100": ("speedup_vs_hf", 3.0, True),
    "batch1-128": ("latency_p50_ms", None, False),  # what FP8 does to a small M: measured, no target
}
MIN_COSINE = 0.99  # fp8 against bf16
MAX_SCORE_DRIFT = 0.05  # fp8 against bf16, relevance in [0, 1]


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    smoke = getattr(options, "smoke", False)
    device = "cpu" if smoke else "cuda"
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    records, failures = [], []
    for case, measure_case in CASES.items():
        try:
            measured, backend, drift = measure_case(options, device, smoke)
        except Exception as error:  # the case's failure; the next case still runs
            failures.append(f"{case}: {type(error).__name__}: {error}")
            print(f"{case}: FAILED {type(error).__name__}: {error}")
            continue
        finally:
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        context = RunContext(options.suite, MODEL, gpu, backend)
        metric, target, higher = TARGETS[case]
        fp8, baseline = measured
        records.append(context.record(case, metric, fp8, unit_of(metric), baseline))
        verdict = "no target"
        if target is not None:
            met = fp8 >= target if higher else fp8 <= target
            records.append(context.record(case, f"{metric}_target", target, unit_of(metric)))
            verdict = f"target {target:g} {'met' if met else 'MISSED'}"
        name, value, bad = drift
        records.append(context.record(case, name, value, "cosine" if "cosine" in name else "probability"))
        print(f"{case}: fp8 {fp8:,.3f} against {baseline:,.3f} {unit_of(metric)}; {verdict}; "
              f"{name} {value:.5f}")  # fmt: skip
        if bad:
            failures.append(f"{case}: {name} {value:.5f}")
    return SuiteOutcome(records, failures)


def unit_of(metric: str) -> str:
    return {"tokens_per_s": "tokens/s", "latency_p50_ms": "ms", "speedup_vs_hf": "x"}[metric]


def engines(folder: Path, device: str, smoke: bool, backend: str):
    """(bf16 engine, fp8 engine) of one checkpoint (float32 under smoke)."""
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig
    from engine.layers.fp8 import Fp8Linear
    from engine.layers.fp8_choice import shape_of

    spec = resolve_model(str(folder))
    built = []
    for quantization in ("none", "fp8"):
        config = EngineConfig(
            device=device, dtype="float32" if smoke else "bfloat16", attention_backend=backend,
            max_batch_tokens=MAX_BATCH_TOKENS, max_queue_tokens=64 * MAX_BATCH_TOKENS,
            cuda_graphs="off" if smoke else "lazy", quantization=quantization,
        )  # fmt: skip
        built.append(build_engine(spec, config))
    chosen = {
        f"{name.rsplit('.', 1)[-1]} {shape_of(layer)}": layer.min_rows
        for name, layer in built[-1].runner.model.named_modules()
        if isinstance(layer, Fp8Linear)
    }
    print(f"{folder.name}: fp8 from rows {chosen or 'nowhere: the model dtype throughout'}")
    return spec, built


def saturation(options, device: str, smoke: bool):
    checkpoint = save_bert(Path(tempfile.mkdtemp()), "smoke" if smoke else "bert-base")
    spec, (plain, fp8) = engines(checkpoint.folder, device, smoke, options.backend)
    rng = np.random.default_rng(1)
    requests = [
        [[2, *rng.integers(5, spec.vocab_size, 48).tolist(), 3] for _ in range(64)]
        for _ in range(4 if smoke else 256)
    ]
    loop = asyncio.new_event_loop()
    rates, vectors = [], []
    try:
        for engine in (plain, fp8):

            async def saturate(engine=engine):
                return await asyncio.gather(*(engine.run(request) for request in requests))

            for _ in range(3):  # eager, capture, replay
                out = loop.run_until_complete(saturate())
            seconds = timed(
                lambda: loop.run_until_complete(saturate()), 1 if smoke else options.rounds, device
            )
            rates.append(50 * 64 * len(requests) / statistics.median(seconds))
            vectors.append(np.concatenate(out))
    finally:
        plain.stop()
        fp8.stop()
        loop.close()
    cosine = min_cosine(vectors[1], vectors[0])
    return (rates[1], rates[0]), engine_backend(fp8), ("min_cosine_vs_bf16", cosine, cosine < MIN_COSINE)


def rerank_case(kind: str):
    """A 50-pair rerank of 512-token pairs (smoke: 128) with a cross-encoder or a judge: p50 of each."""

    def measure(options, device: str, smoke: bool):
        from scoring.rerank import RerankOptions, rerank_scores

        save, shape = (save_bert, "bert-base") if kind == "cross-encoder" else (save_qwen3, "qwen3-0.6b")
        checkpoint = save(Path(tempfile.mkdtemp()), "smoke" if smoke else shape, kind)
        spec, (plain, fp8) = engines(checkpoint.folder, device, smoke, options.backend)
        rng = random.Random(2)
        loop = asyncio.new_event_loop()
        p50, scores = [], []
        try:
            for engine in (plain, fp8):
                tokenizer, model = rerank_model(engine, checkpoint.folder, kind, spec.max_seq_length)
                query = tokenizer.encode(
                    model.prompts.query_text(words(12, random.Random(1))), add_special_tokens=False
                ).ids
                room = (128 if smoke else 512) - len(query) - model.pair.num_special_tokens
                rng.seed(2)
                documents = [words(room, rng) for _ in range(50)]
                texts = [model.prompts.document_text(document) for document in documents]
                docs = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]

                def score(model=model, query=query, docs=docs):
                    return loop.run_until_complete(rerank_scores(model, query, docs, RerankOptions()))

                for _ in range(3):
                    out = score()
                samples = timed(score, 5 if smoke else 20 * options.rounds, device)
                p50.append(1000 * float(np.median(samples)))
                scores.append(out)
        finally:
            plain.stop()
            fp8.stop()
            loop.close()
        drift = float(np.abs(scores[1] - scores[0]).max())
        return (
            (p50[1], p50[0]),
            engine_backend(fp8),
            ("max_score_drift_vs_bf16", drift, drift > MAX_SCORE_DRIFT),
        )

    return measure


def qwen2_mixed(options, device: str, smoke: bool):
    import torch

    dtype = torch.float32 if smoke else torch.bfloat16
    folder = Path(tempfile.mkdtemp())
    checkpoint = save_layout(
        folder, "smoke" if smoke else "qwen2-1.5b", device=device, dtype=dtype, layout=QWEN2
    )
    baseline = Baseline(checkpoint, device, dtype, batch_size=16)
    _, (plain, fp8) = engines(folder, device, smoke, options.backend)
    mixed = mixed_sequences(checkpoint.reference.config.vocab_size, 12 if smoke else NUM_TEXTS)
    tokens = sum(map(len, mixed))
    samples, vectors = each_engine((plain, fp8), mixed, 1 if smoke else 2 * options.rounds, device)
    rates = [tokens / statistics.median(seconds) for seconds in samples]
    timed(lambda: baseline.embed_ids(mixed), 1, device)
    hf = tokens / statistics.median(
        timed(lambda: baseline.embed_ids(mixed), 1 if smoke else options.rounds, device)
    )
    print(
        f"qwen2-1.5b-mixed100: bf16 {rates[0] / 1e3:.0f}k tokens/s ({rates[0] / hf:.2f}x HF), "
        f"fp8 {rates[1] / 1e3:.0f}k"
    )
    cosine = min_cosine(vectors[1], vectors[0])
    return (
        (rates[1] / hf, rates[0] / hf),
        engine_backend(fp8),
        ("min_cosine_vs_bf16", cosine, cosine < MIN_COSINE),
    )


def each_engine(engines, sequences, count: int, device: str) -> tuple[list[list[float]], list[np.ndarray]]:
    """Each engine's `count` timed runs of `sequences`, after three (eager, capture, replay), and its rows;
    the engines are stopped after."""
    loop = asyncio.new_event_loop()
    samples, rows = [], []
    try:
        for engine in engines:
            for _ in range(3):
                out = loop.run_until_complete(engine.run(sequences))
            samples.append(
                timed(lambda engine=engine: loop.run_until_complete(engine.run(sequences)), count, device)
            )
            rows.append(out)
    finally:
        for engine in engines:
            engine.stop()
        loop.close()
    return samples, rows


def batch_one(options, device: str, smoke: bool):
    """One 128-token text (smoke: 16) at a time through each engine: p50 of each."""
    checkpoint = save_bert(Path(tempfile.mkdtemp()), "smoke" if smoke else "bert-base")
    spec, (plain, fp8) = engines(checkpoint.folder, device, smoke, options.backend)
    rng = np.random.default_rng(3)
    text = [[2, *rng.integers(5, spec.vocab_size, 14 if smoke else 126).tolist(), 3]]
    samples, vectors = each_engine((plain, fp8), text, 5 if smoke else 200, device)
    p50 = [1000 * float(np.median(seconds)) for seconds in samples]
    cosine = min_cosine(vectors[1], vectors[0])
    return (p50[1], p50[0]), engine_backend(fp8), ("min_cosine_vs_bf16", cosine, cosine < MIN_COSINE)


CASES = {
    "saturation-50tok": saturation,
    "cross-encoder-50x512": rerank_case("cross-encoder"),
    "qwen3-reranker-50x512": rerank_case("judge"),
    "qwen2-1.5b-mixed100": qwen2_mixed,
    "batch1-128": batch_one,
}
