"""The torch attention backend: SDPA over each run of equal-length sequences; the reference and CPU path."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, Window
from engine.attention.metadata import AttentionMetadata
from engine.attention.position_bias import PositionBias


def window_mask(
    seqlen: int, window: Window, device: torch.device, num_keys: int | None = None, aligned_end: bool = True
) -> torch.Tensor:
    """Boolean [seqlen, num_keys] mask (num_keys None: seqlen), True where a query may attend a key; with
    more keys than queries, the queries are the last of them (a shared prefix's continuation) where
    `aligned_end`, else query j sits at key position j (query-only tokens after the keys)."""
    left, right = window
    num_keys = seqlen if num_keys is None else num_keys
    first = num_keys - seqlen if aligned_end else 0
    query = torch.arange(first, first + seqlen, device=device)[:, None]
    key = torch.arange(num_keys, device=device)[None, :]
    allowed = torch.ones(seqlen, num_keys, dtype=torch.bool, device=device)
    if left >= 0:
        allowed &= key >= query - left
    if right >= 0:
        allowed &= key <= query + right
    return allowed


def run_mask(
    seqlen: int, window: Window | None, bias: PositionBias | None, q: torch.Tensor
) -> torch.Tensor | None:
    """SDPA's mask for sequences of `seqlen` tokens: boolean for a window, additive (in q's dtype, -inf
    outside the window) for a position bias, None for neither."""
    allowed = None if window is None else window_mask(seqlen, window, q.device)
    if bias is None:
        return allowed
    additive = bias.matrix(seqlen).to(q.dtype)
    return additive if allowed is None else additive.masked_fill(~allowed, float("-inf"))


class TorchAttention(AttentionBackend):
    name = "torch"
    graph_safe = False  # splits the batch by the host-side runs of the metadata
    adds_position_bias = True
    reads_key_layout = True
    head_dims = None
    dtypes = None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: Window | None,
        scale: float | None = None,
        bias: PositionBias | None = None,
    ) -> torch.Tensor:
        # q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q
        _, num_heads, head_dim = q.shape
        if k.shape[1] != num_heads:
            k = k.repeat_interleave(num_heads // k.shape[1], dim=1)
            v = v.repeat_interleave(num_heads // v.shape[1], dim=1)
        # a causal mask without a window or bias is SDPA's own is_causal; else an explicit mask says it
        # (SDPA's is_causal aligns at the start, so continuations of shared prefixes say it by a mask too)
        use_is_causal = causal and window is None and bias is None and meta.keys is None
        if causal and not use_is_causal:
            window = (window[0] if window is not None else -1, 0)
        if meta.keys is not None:
            return continuations(q, k, v, meta, window, scale)
        out = q.new_empty(q.shape)
        masks: dict[int, torch.Tensor | None] = {}
        for first, num_seqs, seqlen in meta.runs:
            end = first + num_seqs * seqlen
            # views, no copy: [num_seqs * seqlen, heads, dim] -> [num_seqs, heads, seqlen, dim]
            run_q, run_k, run_v = (
                x[first:end].view(num_seqs, seqlen, num_heads, head_dim).transpose(1, 2) for x in (q, k, v)
            )
            if seqlen not in masks:
                masks[seqlen] = run_mask(seqlen, window, bias, q)
            run_out = F.scaled_dot_product_attention(
                run_q, run_k, run_v, attn_mask=masks[seqlen], is_causal=use_is_causal, scale=scale
            )
            out[first:end].view(num_seqs, seqlen, num_heads, head_dim).copy_(run_out.transpose(1, 2))
        return out


def continuations(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    window: Window | None,
    scale: float | None,
) -> torch.Tensor:
    """Each sequence against its own keys (meta.keys: k and v already gathered), one at a time."""
    out = q.new_empty(q.shape)
    # from the host lengths: reading cu_seqlens on a device would sync it
    query_starts = list(itertools.accumulate(meta.seqlens, initial=0))
    key_starts = list(itertools.accumulate(meta.keys.seqlens, initial=0))
    for seq, (seqlen, num_keys) in enumerate(zip(meta.seqlens, meta.keys.seqlens)):
        queries = slice(query_starts[seq], query_starts[seq] + seqlen)
        keys = slice(key_starts[seq], key_starts[seq] + num_keys)
        aligned_end = meta.keys.aligned_end
        mask = None if window is None else window_mask(seqlen, window, q.device, num_keys, aligned_end)
        seq_q, seq_k, seq_v = (x.transpose(0, 1) for x in (q[queries], k[keys], v[keys]))
        seq_out = F.scaled_dot_product_attention(seq_q, seq_k, seq_v, attn_mask=mask, scale=scale)
        out[queries] = seq_out.transpose(0, 1)
    return out
