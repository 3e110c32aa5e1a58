"""Rotary position embeddings over packed positions, in HF's "rotate half" (non-interleaved) layout."""

from __future__ import annotations

from collections.abc import Sequence
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


def inverse_frequencies(dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """[dim // 2] float32: the rotary frequencies of `dim` rotated dimensions."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return 1.0 / (theta**exponents)


def rotary_tables(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    # [num_tokens] positions -> cos, sin: [num_tokens, head_dim] in `dtype`, angles computed in float32
    angles = positions.float()[:, None] * inverse_frequencies(head_dim, theta, positions.device)[None, :]
    return tables(angles, dtype)


def stream_rotary_tables(
    positions: torch.Tensor, frequencies: torch.Tensor, streams: Sequence[int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables of several position streams ([num_streams, num_tokens]: M-RoPE's temporal, height
    and width positions; a vision tower's height and width): frequency j of `frequencies` ([head_dim // 2]
    float32) turns by the position of stream `streams[j]` (sectioned_streams, interleaved_streams).
    Where the streams agree (a text's tokens), these are rotary_tables'."""
    stream = torch.tensor(streams)
    if positions.is_cuda:  # from pinned memory: a copy from pageable memory waits for the queued kernels
        stream = stream.pin_memory()
    angles = positions.float()[stream.to(positions.device, non_blocking=True)].T * frequencies[None, :]
    return tables(angles, dtype)


def sectioned_streams(sections: Sequence[int]) -> list[int]:
    """Each frequency's stream where the streams take consecutive sections of them (Qwen2-VL's M-RoPE, its
    vision tower's rows then columns): [0] * sections[0] + [1] * sections[1] + ..."""
    return [stream for stream, size in enumerate(sections) for _ in range(size)]


def interleaved_streams(sections: Sequence[int]) -> list[int]:
    """Each frequency's stream where they take turns (Qwen3-VL's interleaved M-RoPE): stream s > 0 has
    frequencies s, s + n, s + 2n, ... below n * sections[s] (n streams), stream 0 all the others."""
    count = len(sections)
    stream = [0] * sum(sections)
    for index in range(1, count):
        for frequency in range(index, min(count * sections[index], len(stream)), count):
            stream[frequency] = index
    return stream


def tables(angles: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # [num_tokens, head_dim // 2] float32 angles -> cos, sin: [num_tokens, head_dim] in `dtype`
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # [num_tokens, num_heads, head_dim] -> the same, rotated by each token's position
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
