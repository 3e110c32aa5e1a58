"""The engine suite (CUDA): posy's engine against HF transformers on the same BERT-base-shaped
random weights, bf16, one run: batch-1 latency, mixed-length and saturation throughput, overlap,
graph capture time and memory; then the kernel comparisons of benchmarks/kernels.py."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.baseline import Baseline, min_cosine
from benchmarks.checkpoints import save_bert
from benchmarks.kernels import attention_records, gelu_epilogue_records
from benchmarks.records import RunContext, SuiteOutcome, engine_backend

MODEL = "bert-base-shape (random weights)"
MIN_COSINE = 0.999  # posy in bf16 against the reference in fp32 ("same vector", DESIGN.md)
HF_BATCH_SIZE = 32
VOCAB_SIZE = 30522


def random_sequences(lengths: list[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[2, *rng.integers(5, VOCAB_SIZE, n - 2).tolist(), 3] for n in lengths]


def percentile_ms(samples: list[float], q: float) -> float:
    return 1000 * float(np.percentile(samples, q))


def gpu_busy_fraction(profile) -> float:
    """The union of kernel and copy intervals over the span from the first to the last."""
    intervals = sorted(
        (event.time_range.start, event.time_range.end)
        for event in profile.events()
        if event.device_type.name == "CUDA" and event.time_range.end > event.time_range.start
    )
    busy, current_start, current_end = 0.0, *intervals[0]
    for start, end in intervals[1:]:
        if start > current_end:
            busy += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    busy += current_end - current_start
    return busy / (intervals[-1][1] - intervals[0][0])


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.batch import pack
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig

    # one HF module on the GPU: bf16 for the speed baseline, fp32 for the parity reference
    checkpoint = save_bert(Path(tempfile.mkdtemp()), "bert-base")
    hf = Baseline(checkpoint, "cuda", torch.bfloat16, batch_size=HF_BATCH_SIZE)
    hf_single = Baseline(checkpoint, "cuda", torch.bfloat16, batch_size=1)
    spec = resolve_model(str(checkpoint.folder))
    config = EngineConfig(
        device="cuda", dtype="bfloat16", attention_backend=options.backend, max_batch_tokens=16384,
        max_queue_tokens=64 * 16384, cuda_graphs="lazy",
    )  # fmt: skip
    launches: list[tuple[float, int]] = []  # (host time, tokens) of every batch the engine launches
    engine = build_engine(
        spec, config, on_batch=lambda tokens, _: launches.append((time.perf_counter(), tokens))
    )
    runner = engine.runner
    gpu = torch.cuda.get_device_name()
    context = RunContext(suite=options.suite, model=MODEL, gpu=gpu, backend=engine_backend(engine))
    loop = asyncio.new_event_loop()
    records = []

    def sync_time(function, repeats: int) -> list[float]:
        samples = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            function()
            samples.append(time.perf_counter() - start)
        return samples

    def embed_batch1() -> np.ndarray:
        return runner.step(pack(single)).result()

    async def saturate() -> None:
        await asyncio.gather(*(engine.run(request) for request in requests))

    single = random_sequences([128], seed=1)
    mixed = random_sequences(np.random.default_rng(2).integers(16, 513, 100).tolist(), seed=3)
    requests = [random_sequences([50] * 64, seed=100 + i) for i in range(256)]
    try:
        # 1. batch 1 x 128 tokens: step to pooled vector on the host
        for _ in range(3):  # eager, capture, replay
            embed_batch1()
        posy_latency = sync_time(embed_batch1, options.rounds * 100)
        sync_time(lambda: hf_single.embed_ids(single), 10)  # HF warm-up (cuBLAS heuristics, allocator)
        hf_latency = sync_time(lambda: hf_single.embed_ids(single), options.rounds * 40)
        posy_p50, hf_p50 = percentile_ms(posy_latency, 50), percentile_ms(hf_latency, 50)
        records.append(context.record("batch1x128", "latency_p50_ms", posy_p50, "ms", hf_p50))
        records.append(context.record("batch1x128", "latency_p99_ms", percentile_ms(posy_latency, 99), "ms"))
        print(f"batch 1x128: posy p50 {posy_p50:.3f} ms, HF eager {hf_p50:.3f} ms ({hf_p50 / posy_p50:.1f}x)")

        # 2. 100 mixed texts of 16..512 tokens: real tokens per second
        for _ in range(3):
            posy_vectors = loop.run_until_complete(engine.run(mixed))
        posy_mixed = sync_time(lambda: loop.run_until_complete(engine.run(mixed)), options.rounds * 4)
        sync_time(lambda: hf.embed_ids(mixed), 2)
        hf_mixed = sync_time(lambda: hf.embed_ids(mixed), options.rounds * 2)
        mixed_tokens = sum(map(len, mixed))
        posy_rate = mixed_tokens / statistics.median(posy_mixed)
        hf_rate = mixed_tokens / statistics.median(hf_mixed)
        records.append(context.record("mixed100", "real_tokens_per_s", posy_rate, "tokens/s", hf_rate))
        print(
            f"mixed 100: posy {posy_rate / 1e6:.2f}M/s, HF {hf_rate / 1e6:.2f}M/s, {posy_rate / hf_rate:.2f}x"
        )

        # parity: posy in bf16 against HF in fp32 on the same weights
        hf.to(torch.float32)
        cosine = min(
            min_cosine(embed_batch1(), hf.embed_ids(single)), min_cosine(posy_vectors, hf.embed_ids(mixed))
        )
        hf.to(torch.bfloat16)
        records.append(context.record("mixed100", "min_cosine_vs_fp32_reference", cosine, "cosine"))

        # 3. 50-token inputs at saturation, through the scheduler, many batches in flight
        for _ in range(3):
            loop.run_until_complete(saturate())
        saturation = sync_time(lambda: loop.run_until_complete(saturate()), options.rounds)
        rate = 50 * 64 * len(requests) / statistics.median(saturation)
        # steady state: from the first launch to the last of one run, the tokens launched in between
        # (the end-to-end rate above also holds the burst of submissions before the first launch)
        launches.clear()
        loop.run_until_complete(saturate())
        steady = sum(tokens for _, tokens in launches[:-1]) / (launches[-1][0] - launches[0][0])
        records.append(context.record("saturation-50tok", "steady_tokens_per_s", steady, "tokens/s"))
        hf_saturated = Baseline(checkpoint, "cuda", torch.bfloat16, batch_size=256)
        sync_time(lambda: hf_saturated.embed_ids(requests[0] * 4), 2)
        hf_saturation = sync_time(lambda: hf_saturated.embed_ids(requests[0] * 4), options.rounds)
        hf_rate = 50 * 256 / statistics.median(hf_saturation)
        records.append(context.record("saturation-50tok", "tokens_per_s", rate, "tokens/s", hf_rate))
        with profile(activities=[ProfilerActivity.CUDA]) as trace:
            loop.run_until_complete(saturate())
            torch.cuda.synchronize()
        busy = gpu_busy_fraction(trace)
        records.append(context.record("saturation-50tok", "gpu_busy_fraction", busy, "fraction"))
        print(
            f"saturation 50-token: posy {rate / 1e6:.2f}M tok/s (steady {steady / 1e6:.2f}M), "
            f"HF {hf_rate / 1e6:.2f}M, GPU busy {busy:.3f}"
        )

        # 4. graphs: capture time per bucket and memory
        graphs = runner.graphs
        if graphs is not None and graphs.capture_seconds:
            captures = [1000 * seconds for seconds in graphs.capture_seconds.values()]
            records.append(context.record("graphs", "capture_ms_max", max(captures), "ms"))
            records.append(context.record("graphs", "capture_ms_median", statistics.median(captures), "ms"))
            records.append(context.record("graphs", "graph_memory_mib", graphs.memory_bytes / 2**20, "MiB"))
            records.append(context.record("graphs", "num_graphs", len(graphs.graphs), "graphs"))
            print(f"graphs: {len(graphs.graphs)}, capture max {max(captures):.0f} ms")

        # 5. the kernel comparisons behind the engine's choices
        kernel_records = attention_records(context) + gelu_epilogue_records(context)
        records.extend(kernel_records)
        for record in kernel_records:
            print(f"{record.case}: {record.value:.1f} us against {record.baseline:.1f} us")
    finally:
        engine.stop()
        loop.close()
    failures = [] if cosine >= MIN_COSINE else [f"min cosine {cosine:.5f} < {MIN_COSINE}"]
    return SuiteOutcome(records, failures)
