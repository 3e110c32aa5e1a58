"""Vectors on the wire: float lists or base64 of little-endian float32, `dimensions` truncation."""

from __future__ import annotations

import numpy as np

from api.errors import InvalidInput
from api.quantize import base64_rows, float_rows


def check_dimensions(dimensions: int | None, model_dimensions: int, param: str = "dimensions") -> None:
    """Checked before the model runs: `dimensions` may only shorten the model's vectors."""
    if dimensions is not None and not 1 <= dimensions <= model_dimensions:
        raise InvalidInput(
            f"{param} must be between 1 and the model's {model_dimensions}, not {dimensions}", param
        )


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` values and re-normalize (Matryoshka-style)."""
    check_dimensions(dimensions, vectors.shape[1])
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    kept = vectors[:, :dimensions]
    norms = np.linalg.norm(kept, axis=1, keepdims=True)
    return kept / np.maximum(norms, 1e-12)


def encode_vectors(vectors: np.ndarray, encoding_format: str) -> list:
    return base64_rows(vectors) if encoding_format == "base64" else float_rows(vectors)
