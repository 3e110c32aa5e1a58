"""Long documents -> windows that fit the model; a document scores the max of its chunks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def split_into_chunks(
    ids: Sequence[int], chunk_len: int, max_chunks: int | None = None
) -> list[Sequence[int]]:
    """Consecutive windows of at most `chunk_len` tokens; an empty document is one empty chunk."""
    if chunk_len < 1:
        raise ValueError("chunk_len must be at least 1")
    chunks = [ids[start : start + chunk_len] for start in range(0, len(ids), chunk_len)] or [ids[:0]]
    return chunks[:max_chunks] if max_chunks is not None else chunks


def max_over_chunks(chunk_scores: np.ndarray, chunk_owner: np.ndarray, num_docs: int) -> np.ndarray:
    """[num_chunks] scores + the document of each chunk -> [num_docs] best score per document."""
    best = np.full(num_docs, -np.inf, dtype=np.float64)
    np.maximum.at(best, chunk_owner, chunk_scores.astype(np.float64))
    return best
