"""Vectors on the wire: float lists, base64 of little-endian float32 or of Perplexity's and Voyage's
quantized codes, `dimensions` truncation."""

from __future__ import annotations

import numpy as np

from api.errors import InvalidInput
from api.quantize import (
    QUANTIZERS,
    base64_rows,
    byte_rows,
    float_rows,
    int8_codes,
    sign_bits,
)

# Perplexity's: base64 of each vector's int8 codes, or of its sign bits (api/quantize.py)
PERPLEXITY_ENCODINGS = ("base64_int8", "base64_binary")


def check_dimensions(dimensions: int | None, model_dimensions: int, param: str = "dimensions") -> None:
    """Checked before the model runs: `dimensions` may only shorten the model's vectors."""
    if dimensions is not None and not 1 <= dimensions <= model_dimensions:
        raise InvalidInput(
            f"{param} must be between 1 and the model's {model_dimensions}, not {dimensions}", param
        )


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None, normalize: bool = True) -> np.ndarray:
    """Keep the first `dimensions` values (Matryoshka-style), re-normalized where the model's vectors are
    (`normalize`); an unnormalized model's (pplx-embed's) stay as they are."""
    check_dimensions(dimensions, vectors.shape[1])
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    kept = vectors[:, :dimensions]
    if not normalize:
        return kept
    norms = np.linalg.norm(kept, axis=1, keepdims=True)
    return kept / np.maximum(norms, 1e-12)


def encode_vectors(vectors: np.ndarray, encoding_format: str, native: str | None = None) -> list:
    """`native`: the model's own quantization (ModelSpec.native_quantization), which base64_int8 gives."""
    if encoding_format == "base64":
        return base64_rows(vectors)
    if encoding_format == "base64_int8":
        return byte_rows(int8_codes(vectors, native))
    if encoding_format == "base64_binary":
        return byte_rows(sign_bits(vectors))
    return float_rows(vectors)


def encode_typed(vectors: np.ndarray, output_dtype: str, base64: bool, native: str | None = None) -> list:
    """Voyage's output_dtype (float, int8, uint8, binary, ubinary; int8 the model's own where it has one),
    as JSON numbers or, with `base64`, each row's little-endian numpy bytes (float32, int8 or uint8)."""
    if output_dtype == "float":
        return base64_rows(vectors) if base64 else float_rows(vectors)
    if output_dtype in ("int8", "uint8"):
        codes = int8_codes(vectors, native)
        if output_dtype == "uint8":
            codes = (codes.astype(np.int16) + 128).astype(np.uint8)
    else:
        codes = QUANTIZERS[output_dtype](vectors)
    return byte_rows(codes) if base64 else codes.tolist()
