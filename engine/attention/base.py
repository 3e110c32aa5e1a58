"""AttentionBackend: what every attention adapter is, and the head, head-size and dtype checks they share."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.errors import AttentionBackendUnavailable

if TYPE_CHECKING:
    from engine.attention.metadata import AttentionMetadata
    from engine.attention.position_bias import PositionBias

Window = tuple[int, int]  # (left, right) keys around each query; -1 is unbounded


class AttentionBackend:
    """An adapter sets `name`, `graph_safe`, `head_dims`, `dtypes` and `adds_position_bias`, and implements
    `forward`."""

    name: str
    # graph-capturable: reads device tensors and an upper-bound max_seqlen, and whatever `prepare` planned
    graph_safe: bool = False
    adds_position_bias: bool = False  # adds a PositionBias to the scores (MPNet's relative positions)
    # runs batches whose keys are laid out apart from their queries (meta.keys: shared prefixes)
    reads_key_layout: bool = False
    head_dims: frozenset[int] | None = None  # None: any
    dtypes: frozenset[torch.dtype] | None = None  # None: any
    reason: str = ""  # why select_backend chose it, for the start-up log
    # chosen by name, not as a candidate: it may spend start-up time a candidate may not (flashinfer
    # compiles a kernel module that is not prebuilt, minutes, where a candidate is passed over instead)
    asked_for: bool = False

    def runs_head_dim(self, head_dim: int) -> bool:
        """Whether every batch of heads of this size runs here (a second model inside the model, such as a
        vision tower, may have heads of another size than the shape this backend was checked for)."""
        return self.head_dims is None or head_dim in self.head_dims

    def check(
        self,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        dtype: torch.dtype | None = None,
        window: Window | None = None,
        position_bias: bool = False,
    ) -> None:
        """Raise AttentionBackendUnavailable saying why this backend cannot run the shape; None skips."""
        if position_bias and not self.adds_position_bias:
            raise AttentionBackendUnavailable(f"{self.name} cannot add a relative position bias")
        if num_heads is not None and num_kv_heads is not None:
            if num_kv_heads < 1 or num_heads % num_kv_heads:
                raise AttentionBackendUnavailable(
                    f"{num_heads} query heads are not a multiple of {num_kv_heads} key/value heads"
                )
        if head_dim is not None and self.head_dims is not None and head_dim not in self.head_dims:
            raise AttentionBackendUnavailable(
                f"{self.name} supports head dims {describe_head_dims(self.head_dims)}, not {head_dim}"
            )
        if dtype is not None and self.dtypes is not None and dtype not in self.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            raise AttentionBackendUnavailable(
                f"{self.name} supports {names}, not {str(dtype).removeprefix('torch.')}"
            )

    def describe(self) -> str:
        """The backend as the start-up log names it."""
        return self.name

    def prepare(
        self, meta: AttentionMetadata, cu_seqlens: torch.Tensor, key_cu_seqlens: torch.Tensor | None = None
    ) -> None:
        """Before a CUDA graph captured on `meta` runs (its warm-up, its capture, each replay): the
        lengths it will run, `cu_seqlens` on the host (the graph's slots; a view of a buffer that is
        written again, so a backend that keeps it copies it), and `key_cu_seqlens` likewise where `meta`
        has a key layout (shared prefixes). A backend that reads only the device tensors needs nothing;
        one that plans on the host (flashinfer) plans here."""

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
        """q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q; `scale`
        multiplies the scores before softmax (None: 1 / sqrt(head_dim)); `bias` only where
        `adds_position_bias`."""
        raise NotImplementedError


def describe_head_dims(head_dims: frozenset[int]) -> str:
    dims = sorted(head_dims)
    if len(dims) <= 4:
        return "/".join(map(str, dims))
    step = dims[1] - dims[0]
    if dims == list(range(dims[0], dims[-1] + 1, step)):
        return f"{dims[0]} to {dims[-1]} in steps of {step}"
    return "/".join(map(str, dims))
