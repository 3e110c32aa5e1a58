"""The token-level heads' reference packages, each run over token ids as its encode() runs them (padded
batches of REFERENCE_BATCH): a function (sequences, device, dtype, autocast=False) -> rows on the host, in
posy's row layout. colbert-ai's Checkpoint always runs under fp16 autocast on CUDA; `autocast` keeps that
(its speed as users run it), and without it the rows are computed in `dtype` itself (an fp32 reference, or
the package's own bf16 figure). The tokens suite and the GPU tests share them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

REFERENCE_BATCH = 32  # colbert-ai's, SparseEncoder's and FlagEmbedding's encode() batch size
QUERY_EXPANSION_ID = 103  # BERT's [MASK], a ColBERT query's expansion

Reference = Callable[..., np.ndarray]


def padded(sequences: Sequence[Sequence[int]], device: str):
    """(input_ids, attention_mask) of a padded batch, pad id 0."""
    import torch

    width = max(map(len, sequences))
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
    return ids.to(device), (ids != 0).long().to(device)


def batches(sequences: Sequence[Sequence[int]]):
    for start in range(0, len(sequences), REFERENCE_BATCH):
        yield sequences[start : start + REFERENCE_BATCH]


def prepare_colbert_ai(checkpoint, device: str, dtype, autocast: bool) -> None:
    """colbert-ai's Checkpoint on `device` in `dtype`, under its fp16 autocast only with `autocast`."""
    from colbert.utils.amp import MixedPrecisionManager

    checkpoint.to(device=device, dtype=dtype)
    checkpoint.use_gpu = device == "cuda"  # colbert-ai keeps documents on the GPU only then
    checkpoint.amp_manager = MixedPrecisionManager(autocast and device == "cuda")


def colbert_ai_documents(folder: Path) -> Reference:
    """colbert-ai's document vectors, a row a token (its skiplist's zeros)."""
    return colbert_ai_vectors(folder, queries=False)


def colbert_ai_queries(folder: Path) -> Reference:
    """colbert-ai's query vectors, a row a token: its trailing expansion [MASK]s attend but are no keys
    (out of the attention mask, as its QueryTokenizer leaves them with attend_to_mask_tokens false)."""
    return colbert_ai_vectors(folder, queries=True)


def colbert_ai_vectors(folder: Path, queries: bool) -> Reference:
    from benchmarks.token_checkpoints import colbert_ai_checkpoint

    checkpoint = colbert_ai_checkpoint(folder)

    def reference(sequences, device, dtype, autocast=False):
        import torch

        prepare_colbert_ai(checkpoint, device, dtype, autocast)
        out = []
        with torch.inference_mode():
            for batch in batches(sequences):
                ids, mask = padded(batch, device)
                if queries:
                    vectors = checkpoint.query(ids, mask * expansion_free(ids))
                else:
                    vectors = checkpoint.doc(ids, mask, keep_dims="return_mask")[0]
                out += [
                    vectors[row, : len(sequence)].float().cpu().numpy() for row, sequence in enumerate(batch)
                ]
        return np.concatenate(out)

    return reference


def expansion_free(ids):
    """1 up to each query's trailing run of [MASK]s, 0 over it."""
    import torch

    expansion = torch.flip(torch.cumprod(torch.flip(ids == QUERY_EXPANSION_ID, [1]).long(), dim=1), [1])
    return 1 - expansion


def colbert_ai_max_sim(folder: Path, query: Sequence[int]) -> Reference:
    """MaxSim of each document against `query`: colbert-ai's query and document vectors (its skiplist's
    masked out), scored with torch on the device; a column, as posy's score rows begin."""
    from benchmarks.token_checkpoints import colbert_ai_checkpoint

    checkpoint = colbert_ai_checkpoint(folder)

    def reference(sequences, device, dtype, autocast=False):
        import torch

        prepare_colbert_ai(checkpoint, device, dtype, autocast)
        with torch.inference_mode():
            ids, mask = padded([query], device)
            query_vectors = checkpoint.query(ids, mask * expansion_free(ids))[0]  # [query length, dim]
            scores = []
            for batch in batches(sequences):
                vectors, kept = checkpoint.doc(*padded(batch, device), keep_dims="return_mask")
                # in the documents' dtype, as colbert-ai's colbert_score does (under autocast the two differ)
                similarity = vectors @ query_vectors.to(vectors.dtype).T  # [docs, tokens, query tokens]
                similarity = similarity.masked_fill(~kept.bool().view(*kept.shape[:2], 1), -1e4)
                scores.append(similarity.max(dim=1).values.sum(dim=1).float().cpu().numpy())
        return np.concatenate(scores)[:, None]

    return reference


def sparse_encoder_weights(folder: Path) -> Reference:
    """sentence-transformers' SparseEncoder: each text's vocabulary-wide weights."""
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(folder), device="cpu")

    def reference(sequences, device, dtype, autocast=False):
        import torch

        encoder.to(device=device, dtype=dtype)
        out = []
        with torch.inference_mode():
            for batch in batches(sequences):
                ids, mask = padded(batch, device)
                features = encoder.forward({"input_ids": ids, "attention_mask": mask})
                out.append(features["sentence_embedding"].float().cpu().numpy())
        return np.concatenate(out)

    return reference


def flag_m3_rows(folder: Path, dense_only: bool = False) -> Reference:
    """FlagEmbedding's bge-m3 outputs in posy's row layout, a row a token: [vector | weight], the dense
    vector in a text's first row, then its ColBERT vectors; with `dense_only` each text's dense vector
    alone, as FlagEmbedding computes it without the other two."""
    from benchmarks.token_checkpoints import flag_m3_embedder

    embedder = flag_m3_embedder(folder)

    def reference(sequences, device, dtype, autocast=False):
        import torch

        model = embedder.model.to(device=device, dtype=dtype)
        out = []
        with torch.inference_mode():
            for batch in batches(sequences):
                ids, mask = padded(batch, device)
                features = {"input_ids": ids, "attention_mask": mask}
                everything = not dense_only
                result = model(
                    features, return_dense=True, return_sparse=everything, return_colbert_vecs=everything
                )
                if dense_only:
                    out.append(result["dense_vecs"].float().cpu().numpy())
                    continue
                for row, sequence in enumerate(batch):
                    colbert = result["colbert_vecs"][row, : len(sequence) - 1]
                    vectors = torch.cat([result["dense_vecs"][row : row + 1], colbert])
                    weights = result["sparse_vecs"][row, : len(sequence)]
                    out.append(torch.cat([vectors, weights], dim=-1).float().cpu().numpy())
        return np.concatenate(out)

    return reference


def listwise_vectors(folder: Path) -> Reference:
    """transformers' Qwen3Model with the projector, a prompt at a time: its marker tokens' unit vectors."""
    from benchmarks.token_checkpoints import listwise_reference

    _, vectors = listwise_reference(folder)

    def reference(sequences, device, dtype, autocast=False):
        return np.concatenate([vectors(ids, device, dtype).float().cpu().numpy() for ids in sequences])

    return reference
