"""Packed (varlen) attention: one entry point, `varlen_attention`, and small backend adapters."""

from engine.attention.backends import AttentionBackend, select_backend, varlen_attention
from engine.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata", "select_backend", "varlen_attention"]
