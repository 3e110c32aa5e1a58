"""ModelRunner: moves a packed batch to the device and runs the model (a captured graph where one
fits); returns a LazyTensor at once and never waits for the device."""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.cuda_graphs import GraphCache
from engine.lazy import HostBuffers, LazyTensor
from engine.outputs import HeadOutput


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device, graphs: GraphCache | None = None):
        self.model = model
        self.output: HeadOutput = model.output  # what its head gives (engine/outputs.py)
        self.device = device
        self.graphs = graphs
        self.host_buffers = HostBuffers()

    @property
    def computes_on_launch(self) -> bool:
        """Whether step() computes the batch before it returns (the CPU) rather than queue it on a device
        that runs behind the host."""
        return self.device.type == "cpu"

    @torch.inference_mode()
    def step(self, batch: PackedBatch) -> LazyTensor:
        """[num_tokens] packed host ids -> LazyTensor of [num_seqs, out_dim] float32 rows (a token head's:
        [num_tokens, out_dim])."""
        output = self.graphs.run(batch) if self.graphs is not None else None
        towers = batch.towers() if output is None and self.graphs is not None else None
        if towers is not None:  # a dual encoder's texts and images: each kind through its own graph
            output = self.run_towers(batch, *towers)
        if output is None:
            output = self.eager(batch)
        if batch.scored_against is not None:  # after the graph: scores of sequences against their query
            output = self.model.max_sim(batch, output)
        if batch.kept_rows is not None:  # likewise: the rows the batch's sequences asked for
            kept = batch.kept_rows
            if output.device.type == "cuda" and not kept.is_pinned():
                kept = kept.pin_memory()  # a copy from pageable memory would first wait for the forward
            output = output.index_select(0, kept.to(output.device, non_blocking=True))
        # copied on the compute stream: a later replay, which may overwrite the graph pool's outputs,
        # runs after the copy
        return LazyTensor(output.float(), self.host_buffers)

    def eager(self, batch: PackedBatch) -> torch.Tensor:
        """The model's output for the batch, run eagerly (no graph)."""
        # metadata from the host copy of cu_seqlens: reading lengths on the device would sync it
        meta = AttentionMetadata.build(
            batch.cu_seqlens, batch.max_seqlen, batch.prefix_of, batch.num_query_only
        )
        meta = meta.to(self.device)
        if self.device.type == "cuda":
            batch = batch.pin_memory()  # so the copies below do not block the host
        return self.model(batch.to(self.device), meta)

    def run_towers(self, batch: PackedBatch, texts: PackedBatch, images: PackedBatch) -> torch.Tensor:
        """[num_seqs, out_dim] rows of a batch of texts and images (PackedBatch.towers), each kind run as a
        batch of its own (from a graph where one is captured), its rows copied into the batch's order."""
        output, cuda = None, self.device.type == "cuda"
        for part, seqs in ((texts, batch.images.text_seqs), (images, batch.images.image_seqs)):
            rows = self.graphs.run(part) if self.graphs is not None else None
            if rows is None:
                meta = AttentionMetadata.build(part.cu_seqlens, part.max_seqlen).to(self.device)
                rows = self.model((part.pin_memory() if cuda else part).to(self.device), meta)
            if output is None:
                output = rows.new_empty(batch.num_seqs, rows.shape[1])
            # before the next replay: graphs share one memory pool, so it may overwrite these rows
            seqs = (seqs.pin_memory() if cuda else seqs).to(self.device, non_blocking=True)
            output.index_copy_(0, seqs, rows)
        return output
