"""Attention backends by name, `select_backend` (chosen once at start-up) and the one entry point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttention, Window
from engine.errors import AttentionBackendUnavailable


class AttentionBackend(Protocol):
    name: str

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: Window | None,
    ) -> torch.Tensor: ...


def _torch_backend(device: torch.device) -> AttentionBackend:
    return TorchAttention()


# name -> factory; a factory raises AttentionBackendUnavailable when its backend cannot run on the device
BACKENDS: dict[str, Callable[[torch.device], AttentionBackend]] = {"torch": _torch_backend}
# "auto" tries these in order and takes the first that is available
AUTO_ORDER: dict[str, tuple[str, ...]] = {"cpu": ("torch",), "cuda": ("torch",)}


def select_backend(name: str, device: torch.device | str) -> AttentionBackend:
    device = torch.device(device)
    if name == "auto":
        reasons = []
        for candidate in AUTO_ORDER.get(device.type, ("torch",)):
            try:
                return BACKENDS[candidate](device)
            except AttentionBackendUnavailable as error:
                reasons.append(f"{candidate}: {error}")
        raise AttentionBackendUnavailable(f"no attention backend runs on {device}: {'; '.join(reasons)}")
    if name not in BACKENDS:
        known = ", ".join(["auto", *BACKENDS])
        raise AttentionBackendUnavailable(f"unknown attention backend {name!r}; known: {known}")
    return BACKENDS[name](device)


def normalize_window(window: int | tuple[int, int] | None, causal: bool) -> Window | None:
    """An int is the left window; (left, right) counts keys on each side, -1 unbounded; None is no window."""
    if window is None:
        return None
    left, right = (window, -1) if isinstance(window, int) else window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    return (left, right)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    *,
    backend: AttentionBackend,
    causal: bool = False,
    window: int | tuple[int, int] | None = None,
) -> torch.Tensor:
    # q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q
    if q.shape[1] % k.shape[1] != 0 or k.shape != v.shape:
        raise ValueError(f"bad attention shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    return backend.forward(q, k, v, meta, causal, normalize_window(window, causal))
