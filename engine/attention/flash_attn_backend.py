"""The flash-attn backend: FlashAttention 4 via `flash_attn.cute`; no host-side plan, so CUDA-graph safe."""

from __future__ import annotations

import torch

from engine.attention.base import AttentionBackend, Window
from engine.attention.metadata import AttentionMetadata
from engine.errors import AttentionBackendUnavailable


def head_dims_for(major: int) -> frozenset[int]:
    """FA4's head sizes: multiples of 8 up to 256 on Hopper; up to 128, and 256, on Blackwell."""
    if major == 9:
        return frozenset(range(8, 257, 8))
    return frozenset(range(8, 129, 8)) | {256}


class FlashAttnAttention(AttentionBackend):
    name = "flash-attn"
    graph_safe = True
    reads_key_layout = True
    dtypes = frozenset({torch.bfloat16, torch.float16})

    def __init__(self, compute_capability: tuple[int, int]) -> None:
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except (ImportError, OSError) as error:
            raise AttentionBackendUnavailable(
                f"flash_attn.cute (FlashAttention 4) cannot be imported: {error}"
            ) from error
        self._varlen = flash_attn_varlen_func
        self.head_dims = head_dims_for(compute_capability[0])

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: Window | None,
        scale: float | None = None,
    ) -> torch.Tensor:
        # q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q
        left, right = window if window is not None else (-1, -1)
        # FA4 spells an unbounded side None, not -1; it handles GQA itself. Shared prefixes: each
        # sequence's keys are gathered (meta.keys), and its causal mask ends aligned
        keys = meta.keys
        result = self._varlen(
            q,
            k,
            v,
            cu_seqlens_q=meta.cu_seqlens,
            cu_seqlens_k=meta.cu_seqlens if keys is None else keys.cu_seqlens,
            max_seqlen_q=meta.max_seqlen,
            max_seqlen_k=meta.max_seqlen if keys is None else keys.max_seqlen,
            softmax_scale=scale,
            causal=causal,
            window_size=(None if left < 0 else left, None if right < 0 else right),
        )
        return result[0] if isinstance(result, tuple) else result  # (out, lse) in the versions seen


def flash_attn_backend(device: torch.device) -> FlashAttnAttention:
    if device.type != "cuda":
        raise AttentionBackendUnavailable("needs a CUDA device")
    if not torch.cuda.is_available():
        raise AttentionBackendUnavailable("CUDA is not available")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise AttentionBackendUnavailable(f"needs compute capability 8.0 or newer, not {major}.{minor}")
    return FlashAttnAttention((major, minor))
