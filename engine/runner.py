"""ModelRunner: moves a packed batch to the device and runs the model (a captured graph where one
fits); returns a LazyTensor at once and never waits for the device."""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.cuda_graphs import GraphCache
from engine.lazy import LazyTensor


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device, graphs: GraphCache | None = None):
        self.model = model
        self.device = device
        self.graphs = graphs
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._last_copy: torch.cuda.Event | None = None

    @torch.inference_mode()
    def step(self, batch: PackedBatch) -> LazyTensor:
        """[num_tokens] packed host ids -> LazyTensor of [num_seqs, out_dim] float32 rows."""
        if self._last_copy is not None:
            # graph outputs share one pool: the next replay may overwrite them only once copied
            torch.cuda.current_stream(self.device).wait_event(self._last_copy)
        output = self.graphs.run(batch) if self.graphs is not None else None
        if output is None:
            # metadata from the host copy of cu_seqlens: reading lengths on the device would sync it
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen).to(self.device)
            if self.device.type == "cuda":
                batch = batch.pin_memory()  # so the copies below do not block the host
            output = self.model(batch.to(self.device), meta)
        rows = LazyTensor(output.float(), self.copy_stream)
        self._last_copy = rows.copied
        return rows
