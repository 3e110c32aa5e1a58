"""Vectors on the wire: float lists or base64 of little-endian float32, `dimensions` truncation."""

from __future__ import annotations

import base64

import numpy as np

from api.errors import InvalidInput


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` values and re-normalize (Matryoshka-style)."""
    if dimensions is None:
        return vectors
    if not 1 <= dimensions <= vectors.shape[1]:
        raise InvalidInput(
            f"dimensions must be between 1 and the model's {vectors.shape[1]}, not {dimensions}", "dimensions"
        )
    if dimensions == vectors.shape[1]:
        return vectors
    kept = vectors[:, :dimensions]
    norms = np.linalg.norm(kept, axis=1, keepdims=True)
    return kept / np.maximum(norms, 1e-12)


def encode_vectors(vectors: np.ndarray, encoding_format: str) -> list[list[float]] | list[str]:
    if encoding_format == "base64":
        little_endian = vectors.astype("<f4", copy=False)
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in little_endian]
    return vectors.tolist()
