"""Pooling over packed segments (mean, CLS, last token) and the embedding Pooler; no padding. On CUDA,
mean pooling is one Triton kernel that reads the hidden states once, in their own dtype."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.metadata import AttentionMetadata
from engine.errors import UnsupportedModel
from engine.layers.triton_kernel import triton_kernel


def mean_pool(hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    # [num_tokens, hidden] -> [num_seqs, hidden] float32 (summed in float32); an empty slot gives zeros
    kernel = _triton_kernel() if hidden.is_cuda else None
    if kernel is not None:
        return segment_mean(kernel, hidden, meta.cu_seqlens, meta.num_seqs)
    sums = hidden.new_zeros(meta.num_seqs, hidden.shape[1], dtype=torch.float32)
    sums.index_add_(0, meta.segment_ids, hidden.float())
    return sums / meta.lengths.clamp(min=1).unsqueeze(1)


def cls_rows(meta: AttentionMetadata, num_tokens: int) -> torch.Tensor:
    # [num_seqs] int64: the first token of each sequence. A graph's zero-length slots after a batch
    # that fills its bucket start at num_tokens: clamped, they read the last row, never read back
    return meta.cu_seqlens[:-1].long().clamp(max=num_tokens - 1)


def last_rows(meta: AttentionMetadata, num_tokens: int) -> torch.Tensor:
    # [num_seqs] int64: the last token of each sequence
    return meta.cu_seqlens[1:].long() - 1


def last_kept_rows(meta: AttentionMetadata, input_ids: torch.Tensor, skip_id: int) -> torch.Tensor:
    # [num_seqs] int64: the last token of each sequence that is not `skip_id` (transformers' decoder
    # classifiers pass over trailing pad tokens), its first where all are
    index = torch.arange(input_ids.shape[0], device=input_ids.device)
    kept = torch.where(input_ids != skip_id, index, meta.cu_seqlens[:-1].long()[meta.segment_ids])
    last = torch.zeros(meta.num_seqs, dtype=torch.int64, device=input_ids.device)
    return last.scatter_reduce(0, meta.segment_ids, kept, "amax", include_self=False)


# pooling methods that read one row a sequence: the token indices of those rows, so that the model
# computes only them past its last attention (Backbone.encode's `rows`)
ROW_POOLINGS: dict[str, Callable[[AttentionMetadata, int], torch.Tensor]] = {
    "cls": cls_rows,
    "last": last_rows,
}


def cls_pool(hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    # [num_tokens, hidden] -> [num_seqs, hidden]
    return hidden[cls_rows(meta, hidden.shape[0])]


def last_pool(hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    # [num_tokens, hidden] -> [num_seqs, hidden]
    return hidden[last_rows(meta, hidden.shape[0])]


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
        return self.finish(self.pool(hidden, meta))

    def finish(self, pooled: torch.Tensor) -> torch.Tensor:
        # [num_seqs, hidden] pooled rows -> float32, normalized where the model is
        pooled = pooled.float()
        return F.normalize(pooled, p=2.0, dim=-1) if self.normalize else pooled

    def extra_repr(self) -> str:
        return f"method={self.method}, normalize={self.normalize}"


MEAN_BLOCK_COLUMNS = 128


def segment_mean(kernel, hidden: torch.Tensor, cu_seqlens: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """[num_tokens, hidden] -> [num_seqs, hidden] float32 by the Triton kernel, on the device the
    tensors are on (Triton's interpreter runs it on the CPU in the tests)."""
    hidden = hidden.contiguous()
    out = torch.empty(num_seqs, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    grid = (num_seqs, -(-hidden.shape[1] // MEAN_BLOCK_COLUMNS))
    kernel[grid](hidden, cu_seqlens, out, hidden.shape[1], BLOCK_ROWS=32, BLOCK_COLUMNS=MEAN_BLOCK_COLUMNS)
    return out


@triton_kernel
def _triton_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""

    @triton.jit
    def segment_mean(hidden_ptr, cu_seqlens_ptr, out_ptr, hidden_size, BLOCK_ROWS: tl.constexpr,
                     BLOCK_COLUMNS: tl.constexpr):  # fmt: skip
        # one program per (sequence, block of columns): sums its rows in float32, divides by the count
        sequence = tl.program_id(0)
        columns = tl.program_id(1) * BLOCK_COLUMNS + tl.arange(0, BLOCK_COLUMNS)
        column_mask = columns < hidden_size
        start = tl.load(cu_seqlens_ptr + sequence)
        end = tl.load(cu_seqlens_ptr + sequence + 1)
        total = tl.zeros((BLOCK_ROWS, BLOCK_COLUMNS), dtype=tl.float32)
        for first in range(start, end, BLOCK_ROWS):
            rows = first + tl.arange(0, BLOCK_ROWS)
            mask = (rows < end)[:, None] & column_mask[None, :]
            offsets = rows.to(tl.int64)[:, None] * hidden_size + columns[None, :]
            total += tl.load(hidden_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        count = tl.maximum(end - start, 1).to(tl.float32)
        out_offsets = sequence.to(tl.int64) * hidden_size + columns
        tl.store(out_ptr + out_offsets, tl.sum(total, axis=0) / count, mask=column_mask)

    return segment_mean
