"""PositionBias: an additive attention bias by the key's offset from its query (MPNet's relative position
buckets), shared by every layer of a batch. Past `max_offset` the bias stops changing, so a table of
2 * max_offset + 1 columns a head holds all of it, and a kernel reads it by the offset it computes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class PositionBias:
    """Query i and key j of one sequence score q.k * scale + by_offset[head, clamp(j - i) + max_offset]."""

    by_offset: torch.Tensor  # [num_heads, 2 * max_offset + 1] float32, contiguous
    max_offset: int

    def matrix(self, seqlen: int) -> torch.Tensor:
        # -> [num_heads, seqlen, seqlen] float32, the bias of every (query, key) pair of a sequence
        positions = torch.arange(seqlen, device=self.by_offset.device)
        offsets = (positions[None, :] - positions[:, None]).clamp(-self.max_offset, self.max_offset)
        return self.by_offset[:, offsets + self.max_offset]
