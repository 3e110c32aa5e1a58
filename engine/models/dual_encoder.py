"""A dual encoder's head (CLIP, SigLIP, SigLIP2): a text's row from the text tower, an image's from the vision
tower, both in one space and L2-normalized, in the order of the batch's sequences. Its HeadOutput says it
takes images; a batch of texts alone runs as any text batch, one of images alone through the vision tower
over the batch's own metadata (both in CUDA graphs), and one of both each tower over its own sequences
(eagerly; with CUDA graphs the runner splits such a batch into its texts and its images instead,
PackedBatch.towers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.models.clip import DualEncoderBackbone
from engine.models.head_spec import HeadSpec
from engine.models.heads import Head
from engine.outputs import EMBED, RERANK, SEQUENCE, HeadOutput

if TYPE_CHECKING:
    from torch import nn

    from engine.checkpoint.folder import Checkpoint
    from engine.checkpoint.spec import ModelSpec
    from engine.models.backbone import Backbone

# model types whose checkpoints are dual encoders (engine/models/registry.py's rows name their variants)
DUAL_ENCODER_TYPES = ("clip", "siglip", "siglip2")


class DualEncoder(Head):
    def __init__(self, backbone: DualEncoderBackbone):
        super().__init__(backbone)
        self.output = HeadOutput(
            SEQUENCE, backbone.config.projection_dim, (EMBED, RERANK), takes_images=True,
            image_grids=backbone.config.variant.naflex,
        )  # fmt: skip

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of texts and images -> [num_seqs, projection_dim] float32, normalized
        backbone: DualEncoderBackbone = self.backbone  # type: ignore[assignment]
        images = batch.images
        if images is None:
            if meta is None:
                meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
            return F.normalize(backbone.text_rows(batch, meta).float(), dim=-1)
        if images.pixels is None:  # a host batch run as it is (the runner moves a batch first)
            images = images.to(batch.input_ids.device)
        if images.only_images:  # the batch's own metadata; a CUDA graph captures this path
            if meta is None:
                meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
            rows = backbone.image_rows(images.pixels, batch.positions, meta, images.grids)
            return F.normalize(rows.float(), dim=-1)
        device = batch.input_ids.device
        rows = torch.empty(batch.num_seqs, self.output.width, dtype=torch.float32, device=device)
        if images.text_seqs.numel():
            cu_seqlens = images.text_cu_seqlens
            texts = PackedBatch(
                batch.input_ids[images.text_tokens],
                batch.token_type_ids[images.text_tokens],
                batch.positions[images.text_tokens],
                cu_seqlens.to(device, non_blocking=True),
                int(torch.diff(cu_seqlens).max()),
            )
            text_meta = AttentionMetadata.build(cu_seqlens, texts.max_seqlen).to(device)
            rows[images.text_seqs] = backbone.text_rows(texts, text_meta).float()
        cu_seqlens = images.image_cu_seqlens
        image_meta = AttentionMetadata.build(cu_seqlens, int(torch.diff(cu_seqlens).max())).to(device)
        positions = batch.positions[images.image_tokens]
        rows[images.image_seqs] = backbone.image_rows(
            images.pixels, positions, image_meta, images.grids
        ).float()
        return F.normalize(rows, dim=-1)


@dataclass(frozen=True, slots=True)
class DualEncoderSpec(HeadSpec):
    normalize: bool = True
    pooling: str = "last"  # a text's (an image's: its class token, or SigLIP's attention pool)

    def output_dim(self, hf_config: Any) -> int:
        return getattr(hf_config, "projection_dim", None) or hf_config.text_config.projection_size

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        return DualEncoder(backbone)  # type: ignore[arg-type]


def detect_dual_encoder(checkpoint: Checkpoint) -> DualEncoderSpec | None:
    return DualEncoderSpec() if checkpoint.hf_config.model_type in DUAL_ENCODER_TYPES else None
