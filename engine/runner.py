"""ModelRunner: moves a packed batch to the device and runs the model; never waits for it."""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.lazy import LazyTensor


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device

    @torch.inference_mode()
    def step(self, batch: PackedBatch) -> LazyTensor:
        """[num_tokens] packed host ids -> LazyTensor of [num_seqs, out_dim] float32 rows."""
        # metadata from the host copy of cu_seqlens: reading lengths on the device would sync it
        meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen).to(self.device)
        output = self.model(batch.to(self.device), meta)
        return LazyTensor(output.float())
