"""PackedBatch: sequences laid end to end, described by cu_seqlens; no padding."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class PackedBatch:
    input_ids: torch.Tensor  # [num_tokens] int64
    token_type_ids: torch.Tensor  # [num_tokens] int64 (zeros when the model has no segments)
    positions: torch.Tensor  # [num_tokens] int64, restarting at 0 for every sequence
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32, cumulative sequence lengths
    max_seqlen: int

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    def pin_memory(self) -> PackedBatch:
        return PackedBatch(
            input_ids=self.input_ids.pin_memory(),
            token_type_ids=self.token_type_ids.pin_memory(),
            positions=self.positions.pin_memory(),
            cu_seqlens=self.cu_seqlens.pin_memory(),
            max_seqlen=self.max_seqlen,
        )

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(
            input_ids=self.input_ids.to(device, non_blocking=True),
            token_type_ids=self.token_type_ids.to(device, non_blocking=True),
            positions=self.positions.to(device, non_blocking=True),
            cu_seqlens=self.cu_seqlens.to(device, non_blocking=True),
            max_seqlen=self.max_seqlen,
        )


def pack(
    token_ids: Sequence[Sequence[int]],
    token_type_ids: Sequence[Sequence[int] | None] | None = None,
) -> PackedBatch:
    """Lay sequences end to end on the host; `token_type_ids[i]` None means all zeros."""
    # Python ints for the per-sequence numbers: a batch of one short text (the latency case) then
    # costs a few numpy calls, not a dozen
    lengths = [len(ids) for ids in token_ids]
    if not lengths or min(lengths) == 0:
        raise ValueError("a packed batch needs at least one sequence and no empty sequence")
    num_tokens = sum(lengths)
    cu_seqlens = np.fromiter(itertools.accumulate(lengths, initial=0), dtype=np.int32, count=len(lengths) + 1)
    if isinstance(token_ids[0], np.ndarray):  # views of one tokenized chunk (bulk jobs): no Python ints
        flat_ids = np.concatenate(token_ids, dtype=np.int64)
    else:
        flat_ids = np.fromiter(itertools.chain.from_iterable(token_ids), dtype=np.int64, count=num_tokens)
    positions = np.arange(num_tokens, dtype=np.int64)
    if len(lengths) > 1:
        positions -= np.repeat(cu_seqlens[:-1].astype(np.int64), lengths)
    flat_types = np.zeros(num_tokens, dtype=np.int64)
    if token_type_ids is not None:
        for start, types in zip(cu_seqlens[:-1].tolist(), token_type_ids):
            if types is not None:
                flat_types[start : start + len(types)] = types
    tensors = (torch.from_numpy(array) for array in (flat_ids, flat_types, positions, cu_seqlens))
    return PackedBatch(*tensors, max_seqlen=max(lengths))
