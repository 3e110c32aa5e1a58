"""AttentionMetadata: what every layer of one packed batch shares, computed once per batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class KeyLayout:
    """The keys of a batch whose sequences continue shared prefixes, or end in query-only tokens: sequence
    i's keys are its prefix's tokens, then its own that are keys, gathered into one packed key axis. For
    continuations a causal mask or window is aligned at the end (query j of an Lq-token sequence with Lk
    keys sees keys up to j + Lk - Lq), as FlashAttention's is; query-only tokens follow their keys
    (`aligned_end` False: query j is at key position j)."""

    index: torch.Tensor  # [num_keys] int64: the token row of each key
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32 over the keys
    seqlens: tuple[int, ...]  # host copy of the key lengths
    max_seqlen: int
    aligned_end: bool = True

    def to(self, device: torch.device | str) -> KeyLayout:
        return KeyLayout(
            index=self.index.to(device, non_blocking=True),
            cu_seqlens=self.cu_seqlens.to(device, non_blocking=True),
            seqlens=self.seqlens,
            max_seqlen=self.max_seqlen,
            aligned_end=self.aligned_end,
        )

    @classmethod
    def build(
        cls,
        seqlens: tuple[int, ...],
        prefix_of: torch.Tensor | None,
        num_query_only: torch.Tensor | None = None,
    ) -> KeyLayout:
        lengths = np.asarray(seqlens, dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        prefixes = np.full(len(seqlens), -1) if prefix_of is None else prefix_of.numpy()
        own_keys = None if num_query_only is None else lengths - num_query_only.numpy()
        index, key_lengths = gather_keys(starts, lengths, prefixes, own_keys)
        return cls(
            index=torch.from_numpy(index),
            cu_seqlens=torch.from_numpy(np.concatenate([[0], np.cumsum(key_lengths)]).astype(np.int32)),
            seqlens=tuple(key_lengths.tolist()),
            max_seqlen=int(key_lengths.max()),
            aligned_end=num_query_only is None,
        )


def gather_keys(
    starts: np.ndarray, lengths: np.ndarray, prefix_of: np.ndarray, own_keys: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence's keys as token rows, its prefix's (where prefix_of >= 0) then its own first
    `own_keys` (None: all its own): (index [num_keys] int64, key lengths [num_seqs] int64). Sequences given
    by their first row and length (zero-length ones have no keys)."""
    has_prefix = prefix_of >= 0
    prefix = np.maximum(prefix_of, 0)
    own = lengths if own_keys is None else own_keys
    # two pieces a sequence, its prefix's rows (maybe none) and its own, laid end to end on the key axis
    piece_starts = np.stack([np.where(has_prefix, starts[prefix], 0), starts], axis=1).ravel()
    piece_lengths = np.stack([np.where(has_prefix, lengths[prefix], 0), own], axis=1).ravel()
    key_starts = np.cumsum(piece_lengths) - piece_lengths
    index = np.arange(int(piece_lengths.sum()), dtype=np.int64)
    index += np.repeat(piece_starts - key_starts, piece_lengths)
    return index, piece_lengths.reshape(-1, 2).sum(axis=1)


@dataclass(slots=True)
class AttentionMetadata:
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32
    max_seqlen: int
    seqlens: tuple[int, ...]  # host copy of the lengths, for splitting without a device sync
    # maximal runs of consecutive equal lengths: (first token, num_seqs, seqlen); a run is one batched call
    runs: tuple[tuple[int, int, int], ...]
    segment_ids: torch.Tensor  # [num_tokens] int64, the sequence each token belongs to
    lengths: torch.Tensor  # [num_seqs] int64
    keys: KeyLayout | None = None  # None: each sequence's keys are its own tokens

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
            keys=None if self.keys is None else self.keys.to(device),
        )

    @classmethod
    def build(
        cls,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        prefix_of: torch.Tensor | None = None,
        num_query_only: torch.Tensor | None = None,
    ) -> AttentionMetadata:
        """Build from cu_seqlens; pass a host tensor where there is one (reading lengths syncs a device).
        `prefix_of` and `num_query_only` (PackedBatch's) give sequences that continue shared prefixes, or
        end in query-only tokens, their KeyLayout."""
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
            keys=None
            if prefix_of is None and num_query_only is None
            else KeyLayout.build(seqlens, prefix_of, num_query_only).to(device),
        )
