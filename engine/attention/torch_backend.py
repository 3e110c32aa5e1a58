"""The torch attention backend: SDPA over each run of equal-length sequences; the reference and CPU path."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, Window
from engine.attention.metadata import AttentionMetadata
from engine.attention.position_bias import PositionBias


def window_mask(seqlen: int, window: Window, device: torch.device) -> torch.Tensor:
    """Boolean [seqlen, seqlen] mask, True where a query may attend a key."""
    left, right = window
    query = torch.arange(seqlen, device=device)[:, None]
    key = torch.arange(seqlen, device=device)[None, :]
    allowed = torch.ones(seqlen, seqlen, dtype=torch.bool, device=device)
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
        use_is_causal = causal and window is None and bias is None
        if causal and not use_is_causal:
            window = (window[0] if window is not None else -1, 0)
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
