"""Suite 1, low-latency embeddings: one text at a time, through the engine (request to pooled vector on
the host) at 128 and 512 tokens on the BERT-base shape and 4096 tokens on the Qwen3-0.6B shape (causal),
against HF transformers eager on the same weights; and over HTTP end to end at 128 tokens (the client's
wall time, tokenization and JSON included), from a raw keep-alive connection (the server's own cost) and
from an httpx client. `--smoke`: tiny shapes on the CPU, seconds."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.baseline import Baseline, min_cosine
from benchmarks.checkpoints import save_bert, save_qwen3, words
from benchmarks.live_server import serve, served_backend
from benchmarks.load import run_clients
from benchmarks.records import RunContext, SuiteOutcome, engine_backend
from benchmarks.timing import timed

MODEL = "bert-base / qwen3-0.6b shapes (random weights)"
MIN_COSINE = 0.999  # posy in bf16 against the baseline in fp32 (cosine divergence within 0.1%)
# (case, family, shape, tokens); the smoke run keeps the cases, on tiny shapes and shorter texts
CASES = [
    ("bert-base-128", "bert", "bert-base", 128),
    ("bert-base-512", "bert", "bert-base", 512),
    ("qwen3-0.6b-4096", "qwen3", "qwen3-0.6b", 4096),
]
SMOKE_TOKENS = {128: 16, 512: 64, 4096: 256}
HTTP_CASE = "http-bert-base-128"


def percentile_ms(samples: list[float], q: float) -> float:
    return 1000 * float(np.percentile(samples, q))


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    from engine.batch import pack
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig

    smoke = getattr(options, "smoke", False)
    device = "cpu" if smoke else "cuda"
    dtype, dtype_name = (torch.float32, "float32") if smoke else (torch.bfloat16, "bfloat16")
    repeats = 20 if smoke else 100 * options.rounds

    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    records, failures = [], []
    rng = random.Random(1)
    checkpoints = {}
    backends: dict[str, str] = {}

    def measure(case: str, checkpoint, num_tokens: int) -> None:
        spec = resolve_model(str(checkpoint.folder))
        config = EngineConfig(
            device=device, dtype=dtype_name, attention_backend=options.backend, max_batch_tokens=8192,
            max_queue_tokens=64 * 8192, cuda_graphs="off" if smoke else "lazy",
        )  # fmt: skip
        engine = build_engine(spec, config)
        backends[checkpoint.family] = engine_backend(engine)
        baseline = Baseline(checkpoint, device, dtype, batch_size=1)
        num_specials = 2 if checkpoint.family == "bert" else 1
        sequence = baseline.encode([words(num_tokens - num_specials, rng)])
        assert len(sequence[0]) == num_tokens
        context = RunContext(suite=options.suite, model=MODEL, gpu=gpu, backend=backends[checkpoint.family])
        try:
            for _ in range(3):  # eager, capture, replay
                vector = engine.runner.step(pack(sequence)).result()
            # the parity gate first: a wrong vector's speed is not measured
            hf_vector = baseline.embed_ids(sequence)
            reference = baseline.to(torch.float32).embed_ids(sequence)
            baseline.to(dtype)
            cosine, hf_cosine = min_cosine(vector, reference), min_cosine(hf_vector, reference)
            records.append(context.record(case, "min_cosine_vs_fp32_reference", cosine, "cosine", hf_cosine))
            if cosine < MIN_COSINE:
                print(f"{case}: min cosine {cosine:.5f} (HF in {dtype_name}: {hf_cosine:.5f}): not timed")
                failures.append(f"{case}: min cosine {cosine:.5f} < {MIN_COSINE} (HF's own {hf_cosine:.5f})")
                return
            posy = timed(lambda: engine.runner.step(pack(sequence)).result(), repeats, device)
            timed(lambda: baseline.embed_ids(sequence), 5, device)  # the baseline's warm-up
            hf = timed(lambda: baseline.embed_ids(sequence), max(5, repeats // 5), device)
        finally:
            engine.stop()
        posy_p50, hf_p50 = percentile_ms(posy, 50), percentile_ms(hf, 50)
        records.append(context.record(case, "latency_p50_ms", posy_p50, "ms", hf_p50))
        records.append(context.record(case, "latency_p99_ms", percentile_ms(posy, 99), "ms"))
        print(
            f"{case}: posy p50 {posy_p50:.3f} ms, HF eager {hf_p50:.3f} ms, min cosine {cosine:.5f} "
            f"(HF in {dtype_name}: {hf_cosine:.5f})"
        )

    for case, family, shape, num_tokens in CASES:
        shape = "smoke" if smoke else shape
        if (family, shape) not in checkpoints:
            save = save_bert if family == "bert" else save_qwen3
            checkpoints[family, shape] = save(Path(tempfile.mkdtemp()), shape)
        measure(case, checkpoints[family, shape], SMOKE_TOKENS[num_tokens] if smoke else num_tokens)

    # over HTTP: one client, one 128-token text a request, back to back; a raw keep-alive connection (the
    # server's figure) and an httpx client ("a Python SDK client")
    folder = checkpoints["bert", "smoke" if smoke else "bert-base"].folder
    text = words((SMOKE_TOKENS[128] if smoke else 128) - 2, rng)
    flags = ("--device", device, "--dtype", dtype_name, "--attention-backend", options.backend)
    bodies = [[json.dumps({"input": text, "encoding_format": "base64"}).encode()]]
    window_s = 1.0 if smoke else 5.0
    with serve(folder, *flags) as url:
        http_backend = served_backend(url)
        loads = {
            case: run_clients(url, bodies, duration_s=window_s, warmup_s=window_s / 5, client=client)
            for case, client in ((HTTP_CASE, "raw"), (f"{HTTP_CASE}-httpx", "httpx"))
        }
    context = RunContext(suite=options.suite, model=MODEL, gpu=gpu, backend=http_backend)
    for case, load in loads.items():
        if load.errors:
            failures.append(f"{case}: {len(load.errors)} failed requests, the first: {load.errors[0]}")
        records.append(context.record(case, "latency_p50_ms", load.latency_ms(50), "ms"))
        records.append(context.record(case, "latency_p99_ms", load.latency_ms(99), "ms"))
        print(f"{case}: p50 {load.latency_ms(50):.3f} ms, p99 {load.latency_ms(99):.3f} ms")
    return SuiteOutcome(records, failures)
