"""The torch-varlen backend: torch's built-in `varlen_attn` (FlashAttention kernels), CUDA only and
CUDA-graph safe: it reads cu_seqlens on the device and max_seqlen as an upper bound, nothing on the host."""

from __future__ import annotations

import inspect

import torch

from engine.attention.base import AttentionBackend, Window
from engine.attention.metadata import AttentionMetadata
from engine.errors import AttentionBackendUnavailable


class TorchVarlenAttention(AttentionBackend):
    name = "torch-varlen"
    graph_safe = True
    reads_key_layout = True
    head_dims = frozenset(range(8, 257, 8))  # FlashAttention 2: multiples of 8 up to 256
    dtypes = frozenset({torch.bfloat16, torch.float16})

    def __init__(self) -> None:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError as error:
            raise AttentionBackendUnavailable(
                f"torch {torch.__version__} has no torch.nn.attention.varlen ({error})"
            ) from error
        parameters = inspect.signature(varlen_attn).parameters
        if "window_size" not in parameters:
            raise AttentionBackendUnavailable(
                f"torch {torch.__version__}'s varlen_attn takes no window_size (torch 2.11 and later do)"
            )
        self._varlen_attn = varlen_attn
        # torch 2.11 has no enable_gqa: key/value heads are then repeated up to the query heads
        self._native_gqa = "enable_gqa" in parameters

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
        gqa = {}
        if k.shape[1] != q.shape[1]:
            if self._native_gqa:
                gqa["enable_gqa"] = True
            else:
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        # varlen_attn reads causal from window_size == (-1, 0), a tuple; a causal window is (left, 0)
        if window is not None:
            window_size = (window[0], 0) if causal else (window[0], window[1])
        else:
            window_size = (-1, 0) if causal else (-1, -1)
        # any upper bound of the lengths is correct; at least 2, because FlashAttention's one-token GQA
        # shortcut assumes every sequence has exactly one token, and zero-length padding slots break that
        max_seqlen = max(meta.max_seqlen, 2)
        keys = meta.keys  # shared prefixes: each sequence's keys, gathered; its causal mask ends aligned
        return self._varlen_attn(
            q,
            k,
            v,
            meta.cu_seqlens,
            meta.cu_seqlens if keys is None else keys.cu_seqlens,
            max_seqlen,
            max_seqlen if keys is None else max(keys.max_seqlen, 2),
            scale=scale,
            window_size=window_size,
            **gqa,
        )


def torch_varlen_backend(device: torch.device) -> TorchVarlenAttention:
    if device.type != "cuda":
        raise AttentionBackendUnavailable("needs a CUDA device (varlen_attn runs FlashAttention kernels)")
    if not torch.cuda.is_available():
        raise AttentionBackendUnavailable("CUDA is not available")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise AttentionBackendUnavailable(f"needs compute capability 8.0 or newer, not {major}.{minor}")
    return TorchVarlenAttention()
