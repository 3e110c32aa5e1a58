"""The mixed-texts measurement the qwen3 and families suites share: 100 random token sequences of 16..512
tokens through posy's engine and through the HF baseline, real tokens per second on each side (token ids
in, vectors on the host out: tokenization is outside both)."""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass

import numpy as np

from benchmarks.baseline import Baseline
from benchmarks.timing import timed

NUM_TEXTS, MIN_TOKENS, MAX_TOKENS = 100, 16, 512
MAX_BATCH_TOKENS = 32768  # the 100 texts (about 26k tokens) make one engine batch
POSY_WARM_UPS = 3  # eager, capture, replay of each graph the batch reaches


@dataclass(frozen=True, slots=True)
class Rates:
    posy: float  # real tokens per second, the median of the timed rounds
    hf: float
    vectors: np.ndarray  # posy's, from its last warm-up


def random_sequences(lengths: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, vocab_size, n).tolist() for n in lengths]


def mixed_sequences(vocab_size: int, num_texts: int = NUM_TEXTS) -> list[list[int]]:
    lengths = np.random.default_rng(2).integers(MIN_TOKENS, MAX_TOKENS + 1, num_texts).tolist()
    return random_sequences(lengths, vocab_size, seed=3)


def engine_config(device: str, dtype, backend: str):
    from engine.config import EngineConfig

    return EngineConfig(
        device=device, dtype=str(dtype).removeprefix("torch."), attention_backend=backend,
        max_batch_tokens=MAX_BATCH_TOKENS, max_queue_tokens=64 * MAX_BATCH_TOKENS,
        cuda_graphs="off" if device == "cpu" else "lazy",
    )  # fmt: skip


def measure(
    engine,
    baseline: Baseline,
    sequences: list[list[int]],
    rounds: int,
    device: str,
    loop: asyncio.AbstractEventLoop,
) -> Rates:
    """posy: warm-ups, then `2 x rounds` timed runs; HF: one warm-up, then `rounds` timed runs."""
    for _ in range(POSY_WARM_UPS):
        vectors = loop.run_until_complete(engine.run(sequences))
    posy = timed(lambda: loop.run_until_complete(engine.run(sequences)), rounds * 2, device)
    timed(lambda: baseline.embed_ids(sequences), 1, device)
    hf = timed(lambda: baseline.embed_ids(sequences), rounds, device)
    tokens = sum(map(len, sequences))
    return Rates(tokens / statistics.median(posy), tokens / statistics.median(hf), vectors)
