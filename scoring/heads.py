"""Score heads: model outputs -> relevance in [0, 1], or the raw value TEI's raw_scores asks for."""

from __future__ import annotations

import numpy as np


def logits_to_scores(logits: np.ndarray, raw: bool = False) -> np.ndarray:
    """[n, num_labels] -> [n]: sigmoid of one logit, softmax positive class of two."""
    logits = logits.astype(np.float64)
    if logits.shape[1] == 1:
        logit = logits[:, 0]
        return logit if raw else 1.0 / (1.0 + np.exp(-logit))
    if logits.shape[1] == 2:
        margin = logits[:, 1] - logits[:, 0]
        return logits[:, 1] if raw else 1.0 / (1.0 + np.exp(-margin))
    raise ValueError(f"a reranker needs one or two labels, not {logits.shape[1]}")


def cosine_to_scores(query: np.ndarray, chunks: np.ndarray, raw: bool = False) -> np.ndarray:
    """[dim] query and [n, dim] chunk vectors -> [n] (1 + cosine) / 2 (raw: cosine)."""
    query = query.astype(np.float64)
    chunks = chunks.astype(np.float64)
    norms = np.linalg.norm(chunks, axis=1) * np.linalg.norm(query)
    cosine = chunks @ query / np.maximum(norms, 1e-12)
    return cosine if raw else (1.0 + np.clip(cosine, -1.0, 1.0)) / 2.0


def max_sim_to_scores(max_sims: np.ndarray, num_query_tokens: int, raw: bool = False) -> np.ndarray:
    """[n] MaxSim sums of unit vectors -> [n] (1 + their mean over the query's tokens) / 2 (raw: the sums,
    as PyLate and colbert-ai rank by)."""
    if raw:
        return max_sims
    return (1.0 + np.clip(max_sims / max(num_query_tokens, 1), -1.0, 1.0)) / 2.0
