"""The qwen3 suite (CUDA): posy's engine against HF transformers on the same Qwen3-0.6B-shaped random
weights, bf16, one run: the causal embedder at batch 1 x 128 tokens and on 100 mixed texts of 16..512
tokens, and the yes/no judge scoring one query's 50 documents of 512 tokens. `--smoke` runs a tiny
shape on the CPU in seconds, so that the suite's code is exercised by the test suite."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.records import RunContext, SuiteOutcome

QWEN3_06B = {
    "vocab_size": 151669,
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}
SMOKE = {**QWEN3_06B, "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96}  # fmt: skip
MODEL = "qwen3-0.6b-shape (random weights)"
JUDGE_TOKENS = ("no", "yes")
JUDGE_TOKEN_IDS = [1, 2]  # their ids in the benchmark's tokenizer; text tokens start at 3
MIN_COSINE = 0.999  # posy in bf16 against the reference in fp32 ("same vector", DESIGN.md)
MAX_SCORE_ERROR = 1e-2
HF_BATCH_SIZE = 16


def save_random_qwen3(folder: Path, architecture: str, shape: dict, sentence_transformers: bool):
    """Seeded random weights, a word-level tokenizer.json holding the judge's tokens and, for the
    embedder, sentence-transformers files (last-token pooling, normalized)."""
    import json

    import torch
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    torch.manual_seed(0)
    config = transformers.Qwen3Config(architectures=[architecture], **shape)
    model = getattr(transformers, architecture)(config).eval()
    model.save_pretrained(folder)
    vocab = {"<|endoftext|>": 0, **dict(zip(JUDGE_TOKENS, JUDGE_TOKEN_IDS))}
    Tokenizer(WordLevel(vocab, unk_token="<|endoftext|>")).save(str(folder / "tokenizer.json"))
    if sentence_transformers:
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]
        (folder / "modules.json").write_text(json.dumps(modules))
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "lasttoken"}))
    return model


def random_sequences(lengths: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab_size, n).tolist() for n in lengths]


def hf_last_tokens(model, sequences: list[list[int]], batch_size: int, device: str):
    """HF as people run it: length-sorted padded batches, SDPA, each row's last real token's final
    hidden state (the embedder's vector) or its LM-head logits (a reranker's judgment)."""
    import torch

    order = sorted(range(len(sequences)), key=lambda index: len(sequences[index]))
    rows: dict[int, np.ndarray] = {}
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            lengths = torch.tensor([len(sequences[index]) for index in chunk])
            ids = torch.zeros(len(chunk), int(lengths.max()), dtype=torch.int64)
            mask = torch.zeros_like(ids)
            for row, index in enumerate(chunk):
                ids[row, : len(sequences[index])] = torch.tensor(sequences[index])
                mask[row, : len(sequences[index])] = 1
            output = model(input_ids=ids.to(device), attention_mask=mask.to(device))
            states = output.logits if hasattr(output, "logits") else output.last_hidden_state
            last = states[torch.arange(len(chunk)), (lengths - 1).to(device)].float().cpu().numpy()
            rows.update(zip(chunk, last))
    return np.stack([rows[index] for index in range(len(sequences))])


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def yes_probability(logits: np.ndarray) -> np.ndarray:
    """[n, 2] logits of (no, yes) -> P(yes)."""
    logits = logits.astype(np.float64)
    return 1.0 / (1.0 + np.exp(logits[:, 0] - logits[:, 1]))


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    from engine.batch import pack
    from engine.build import build_engine
    from engine.config import EngineConfig
    from engine.loader import resolve_model

    smoke = getattr(options, "smoke", False)
    device, shape = ("cpu", SMOKE) if smoke else ("cuda", QWEN3_06B)
    dtype = torch.float32 if smoke else torch.bfloat16
    rounds = 1 if smoke else options.rounds

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(function, repeats: int) -> list[float]:
        samples = []
        for _ in range(repeats):
            synchronize()
            start = time.perf_counter()
            function()
            synchronize()
            samples.append(time.perf_counter() - start)
        return samples

    folders = {name: Path(tempfile.mkdtemp()) for name in ("embedder", "judge")}
    hf_embedder = save_random_qwen3(folders["embedder"], "Qwen3Model", shape, True).to(device, dtype)
    hf_judge = save_random_qwen3(folders["judge"], "Qwen3ForCausalLM", shape, False).to(device, dtype)
    config = EngineConfig(
        device=device, dtype=str(dtype).removeprefix("torch."), attention_backend=options.backend,
        max_batch_tokens=32768, max_queue_tokens=64 * 32768, cuda_graphs="off" if smoke else "lazy",
    )  # fmt: skip
    engines = {name: build_engine(resolve_model(str(folder)), config) for name, folder in folders.items()}
    backend = engines["embedder"].runner.model.layers[0].attention.attention_backend.name
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    context = RunContext(suite=options.suite, model=MODEL, gpu=gpu, backend=backend)
    loop = asyncio.new_event_loop()
    records, failures = [], []
    vocab_size = shape["vocab_size"]
    single = random_sequences([128], vocab_size, seed=1)
    mixed = random_sequences(np.random.default_rng(2).integers(16, 513, 100).tolist(), vocab_size, seed=3)
    pairs = random_sequences([512] * 50, vocab_size, seed=4)  # one query's 50 templated (query, doc) pairs

    def engine_run(name: str, sequences: list[list[int]]) -> np.ndarray:
        return loop.run_until_complete(engines[name].run(sequences))

    try:
        # 1. batch 1 x 128 tokens, causal embedder: request to pooled vector on the host
        step = engines["embedder"].runner.step
        for _ in range(3):  # eager, capture, replay
            step(pack(single)).result()
        posy = timed(lambda: step(pack(single)).result(), rounds * 100)
        timed(lambda: hf_last_tokens(hf_embedder, single, 1, device), 5)
        hf = timed(lambda: hf_last_tokens(hf_embedder, single, 1, device), rounds * 20)
        posy_p50, hf_p50 = 1000 * statistics.median(posy), 1000 * statistics.median(hf)
        records.append(context.record("qwen3-batch1x128", "latency_p50_ms", posy_p50, "ms", hf_p50))
        print(f"qwen3 batch 1x128: posy p50 {posy_p50:.3f} ms, HF eager {hf_p50:.3f} ms")

        # 2. 100 mixed texts of 16..512 tokens: real tokens per second
        for _ in range(3):
            vectors = engine_run("embedder", mixed)
        posy = timed(lambda: engine_run("embedder", mixed), rounds * 2)
        timed(lambda: hf_last_tokens(hf_embedder, mixed, HF_BATCH_SIZE, device), 1)
        hf = timed(lambda: hf_last_tokens(hf_embedder, mixed, HF_BATCH_SIZE, device), rounds)
        tokens = sum(map(len, mixed))
        posy_rate, hf_rate = tokens / statistics.median(posy), tokens / statistics.median(hf)
        records.append(context.record("qwen3-mixed100", "real_tokens_per_s", posy_rate, "tokens/s", hf_rate))
        print(f"qwen3 mixed 100: posy {posy_rate / 1e3:.0f}k tokens/s, HF {hf_rate / 1e3:.0f}k")

        # 3. the judge: one query with 50 documents, each pair 512 tokens after templating
        for _ in range(3):
            logits = engine_run("judge", pairs)
        posy = timed(lambda: engine_run("judge", pairs), rounds * 4)
        timed(lambda: hf_last_tokens(hf_judge, pairs, len(pairs), device), 1)
        hf = timed(lambda: hf_last_tokens(hf_judge, pairs, len(pairs), device), rounds * 2)
        posy_ms, hf_ms = 1000 * statistics.median(posy), 1000 * statistics.median(hf)
        records.append(context.record("qwen3-judge-50x512", "latency_p50_ms", posy_ms, "ms", hf_ms))
        print(f"qwen3 judge 50x512: posy {posy_ms:.1f} ms, HF {hf_ms:.1f} ms")

        # parity, against HF in fp32 on the same weights
        hf_embedder.float()
        cosine = min(
            min_cosine(vectors, hf_last_tokens(hf_embedder, mixed, 8, device)),
            min_cosine(step(pack(single)).result(), hf_last_tokens(hf_embedder, single, 1, device)),
        )
        records.append(context.record("qwen3-mixed100", "min_cosine_vs_fp32_reference", cosine, "cosine"))
        hf_judge.float()
        reference = yes_probability(hf_last_tokens(hf_judge, pairs, 8, device)[:, JUDGE_TOKEN_IDS])
        score_error = float(np.abs(yes_probability(logits) - reference).max())
        records.append(context.record("qwen3-judge-50x512", "max_score_error", score_error, "probability"))
        if cosine < MIN_COSINE:
            failures.append(f"embedder min cosine {cosine:.5f} < {MIN_COSINE}")
        if score_error > MAX_SCORE_ERROR:
            failures.append(f"judge score error {score_error:.4f} > {MAX_SCORE_ERROR}")
    finally:
        for engine in engines.values():
            engine.stop()
        loop.close()
    return SuiteOutcome(records, failures)
