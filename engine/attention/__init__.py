"""Packed (varlen) attention: one entry point, `varlen_attention`, and small backend adapters."""

from engine.attention.backends import (
    AUTO_ORDER,
    BACKENDS,
    AttentionBackend,
    for_head_dim,
    normalize_window,
    select_backend,
    varlen_attention,
)
from engine.attention.metadata import AttentionMetadata

__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "for_head_dim",
    "normalize_window",
    "select_backend",
    "varlen_attention",
]
