"""Sparse lexical outputs: a SPLADE row's non-zero vocabulary weights, and bge-m3's lexical weights (each
token id's largest weight in a text, special tokens left out); and their dot product, as the reference
packages score them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np


def nonzero_weights(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[vocab] weights -> (token ids, weights) of the non-zero ones, by token id."""
    indices = np.flatnonzero(row)
    return indices, row[indices]


def lexical_weights(ids: Sequence[int], weights: np.ndarray, unused: Collection[int]) -> dict[int, float]:
    """Each token id's largest positive weight in a text, but for the `unused` ids (bge-m3: its [CLS],
    end, pad and unknown tokens), as FlagEmbedding's BGEM3FlagModel gives them."""
    result: dict[int, float] = {}
    for token, weight in zip(ids, weights.tolist()):
        if token not in unused and weight > 0 and weight > result.get(token, 0.0):
            result[token] = weight
    return result


def sparse_dot(first: Mapping[int, float], second: Mapping[int, float]) -> float:
    """The dot product of two sparse vectors (FlagEmbedding's lexical matching score)."""
    if len(second) < len(first):
        first, second = second, first
    return float(sum(weight * second.get(token, 0.0) for token, weight in first.items()))
