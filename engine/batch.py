"""PackedBatch: sequences laid end to end, described by cu_seqlens; no padding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    pin_memory: bool = False,
) -> PackedBatch:
    """Lay sequences end to end on the host; `token_type_ids[i]` None means all zeros."""
    lengths = [len(ids) for ids in token_ids]
    if not lengths or min(lengths) == 0:
        raise ValueError("a packed batch needs at least one sequence and no empty sequence")
    flat_ids = [token for ids in token_ids for token in ids]
    flat_types: list[int] = []
    for index, length in enumerate(lengths):
        types = token_type_ids[index] if token_type_ids is not None else None
        flat_types.extend(types if types is not None else [0] * length)
    positions = [position for length in lengths for position in range(length)]
    cu_seqlens = [0]
    for length in lengths:
        cu_seqlens.append(cu_seqlens[-1] + length)
    batch = PackedBatch(
        input_ids=torch.tensor(flat_ids, dtype=torch.int64),
        token_type_ids=torch.tensor(flat_types, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32),
        max_seqlen=max(lengths),
    )
    if pin_memory:
        batch = PackedBatch(
            input_ids=batch.input_ids.pin_memory(),
            token_type_ids=batch.token_type_ids.pin_memory(),
            positions=batch.positions.pin_memory(),
            cu_seqlens=batch.cu_seqlens.pin_memory(),
            max_seqlen=batch.max_seqlen,
        )
    return batch
