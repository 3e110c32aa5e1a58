"""What an attention backend supports: the head, head-size and dtype checks every adapter shares."""

from __future__ import annotations

from typing import Protocol

import torch

from engine.errors import AttentionBackendUnavailable

Window = tuple[int, int]  # (left, right) keys around each query; -1 is unbounded


class Supports(Protocol):
    name: str
    head_dims: frozenset[int] | None  # None: any
    dtypes: frozenset[torch.dtype] | None  # None: any


def check_support(
    backend: Supports,
    num_heads: int | None,
    num_kv_heads: int | None,
    head_dim: int | None,
    dtype: torch.dtype | None,
) -> None:
    """Raise AttentionBackendUnavailable saying why `backend` cannot run this shape; None skips a check."""
    if num_heads is not None and num_kv_heads is not None:
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise AttentionBackendUnavailable(
                f"{num_heads} query heads are not a multiple of {num_kv_heads} key/value heads"
            )
    if head_dim is not None and backend.head_dims is not None and head_dim not in backend.head_dims:
        raise AttentionBackendUnavailable(
            f"{backend.name} supports head dims {describe_head_dims(backend.head_dims)}, not {head_dim}"
        )
    if dtype is not None and backend.dtypes is not None and dtype not in backend.dtypes:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in backend.dtypes))
        raise AttentionBackendUnavailable(
            f"{backend.name} supports {names}, not {str(dtype).removeprefix('torch.')}"
        )


def describe_head_dims(head_dims: frozenset[int]) -> str:
    dims = sorted(head_dims)
    if len(dims) <= 4:
        return "/".join(map(str, dims))
    step = dims[1] - dims[0]
    if dims == list(range(dims[0], dims[-1] + 1, step)):
        return f"{dims[0]} to {dims[-1]} in steps of {step}"
    return "/".join(map(str, dims))
