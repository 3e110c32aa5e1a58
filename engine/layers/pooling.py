"""Pooling over packed segments (mean, CLS, last token) and the embedding Pooler; no padding."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.metadata import AttentionMetadata
from engine.errors import UnsupportedModel


def mean_pool(hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    # [num_tokens, hidden] -> [num_seqs, hidden] float32 (summed in float32)
    sums = hidden.new_zeros(meta.num_seqs, hidden.shape[1], dtype=torch.float32)
    sums.index_add_(0, meta.segment_ids, hidden.float())
    return sums / meta.lengths.unsqueeze(1)


def cls_pool(hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    # [num_tokens, hidden] -> [num_seqs, hidden], the first token of each sequence
    return hidden[meta.cu_seqlens[:-1].long()]


def last_pool(hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    # [num_tokens, hidden] -> [num_seqs, hidden], the last token of each sequence
    return hidden[meta.cu_seqlens[1:].long() - 1]


POOLING_METHODS: dict[str, Callable[[torch.Tensor, AttentionMetadata], torch.Tensor]] = {
    "mean": mean_pool,
    "cls": cls_pool,
    "last": last_pool,
}


class Pooler(nn.Module):
    """A pooling method, then an optional L2 normalization, in float32."""

    def __init__(self, method: str, normalize: bool):
        super().__init__()
        if method not in POOLING_METHODS:
            raise UnsupportedModel(f"unknown pooling method {method!r}; known: {', '.join(POOLING_METHODS)}")
        self.method = method
        self.normalize = normalize
        self.pool = POOLING_METHODS[method]

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_seqs, hidden] float32
        pooled = self.pool(hidden, meta).float()
        return F.normalize(pooled, p=2.0, dim=-1) if self.normalize else pooled

    def extra_repr(self) -> str:
        return f"method={self.method}, normalize={self.normalize}"
