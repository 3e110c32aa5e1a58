"""AttentionMetadata: what every layer of one packed batch shares, computed once per batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32
    max_seqlen: int
    seqlens: tuple[int, ...]  # host copy of the lengths, for splitting without a device sync
    # maximal runs of consecutive equal lengths: (first token, num_seqs, seqlen); a run is one batched call
    runs: tuple[tuple[int, int, int], ...]
    segment_ids: torch.Tensor  # [num_tokens] int64, the sequence each token belongs to
    lengths: torch.Tensor  # [num_seqs] int64

    @property
    def num_seqs(self) -> int:
        return len(self.seqlens)

    @property
    def num_tokens(self) -> int:
        return self.segment_ids.shape[0]

    def to(self, device: torch.device | str) -> AttentionMetadata:
        return AttentionMetadata(
            cu_seqlens=self.cu_seqlens.to(device, non_blocking=True),
            max_seqlen=self.max_seqlen,
            seqlens=self.seqlens,
            runs=self.runs,
            segment_ids=self.segment_ids.to(device, non_blocking=True),
            lengths=self.lengths.to(device, non_blocking=True),
        )

    @classmethod
    def build(cls, cu_seqlens: torch.Tensor, max_seqlen: int) -> AttentionMetadata:
        """Build from cu_seqlens; pass a host tensor where there is one (reading lengths syncs a device)."""
        seqlens = tuple(int(n) for n in torch.diff(cu_seqlens.cpu()).tolist())
        runs: list[tuple[int, int, int]] = []
        start = 0
        for seqlen in seqlens:
            if runs and runs[-1][2] == seqlen:
                first, count, _ = runs[-1]
                runs[-1] = (first, count + 1, seqlen)
            else:
                runs.append((start, 1, seqlen))
            start += seqlen
        lengths = torch.tensor(seqlens, dtype=torch.int64)
        segment_ids = torch.repeat_interleave(torch.arange(len(seqlens)), lengths, output_size=start)
        device = cu_seqlens.device
        return cls(
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            seqlens=seqlens,
            runs=tuple(runs),
            segment_ids=segment_ids.to(device, non_blocking=True),
            lengths=lengths.to(device, non_blocking=True),
        )
