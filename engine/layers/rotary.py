"""Rotary position embeddings over packed positions, in HF's "rotate half" (non-interleaved) layout."""

from __future__ import annotations

from typing import Any

import torch

from engine.errors import UnsupportedModel


def rope_theta(hf_config: Any, layer_type: str | None = None) -> float:
    """The rotary base of a config (of one layer type where the config keys them so); only the
    default rotary kind is supported, and anything else is a clear start-up error."""
    parameters = getattr(hf_config, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(parameters.get(layer_type), dict):
        parameters = parameters[layer_type]
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    rope_type = parameters.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise UnsupportedModel(f"rotary embeddings of type {rope_type!r} are not supported")
    # configs written before transformers 5 name ModernBERT's two bases apart
    legacy = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}
    legacy_name = legacy.get(layer_type or "", "rope_theta")
    theta = parameters.get("rope_theta") or getattr(hf_config, legacy_name, None)
    return float(theta or getattr(hf_config, "rope_theta", None) or 10000.0)


def rotary_tables(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    # [num_tokens] positions -> cos, sin: [num_tokens, head_dim] in `dtype`, angles computed in float32
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inverse_frequencies = 1.0 / (theta**exponents)
    angles = positions.float()[:, None] * inverse_frequencies[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # [num_tokens, num_heads, head_dim] -> the same, rotated by each token's position
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
