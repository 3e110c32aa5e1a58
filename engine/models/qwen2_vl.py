"""Qwen2-VL's vision-language backbone (gme-Qwen2-VL's embeddings, the base of jina-reranker-m0 and
ColQwen2): Qwen2's packed decoder whose image placeholder tokens take the rows of its vision tower's
merged patches, under multimodal rotary positions (M-RoPE: a temporal, a height and a width position a
token, each over its section of the rotary frequencies; a text token's three are its position, so a batch
of texts runs as Qwen2 does). The vision tower runs the batch's images as sequences of their own: patches
(engine/layers/patch_embedding.py), 2-D rotary, CLIP's pre-norm blocks, then a merger of each
merge x merge group of patches into one token (engine/inline_images.py lays them out)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, select_backend
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.inline_images import InlineImages
from engine.layers.patch_embedding import PatchEmbedding
from engine.layers.rotary import inverse_frequencies, sectioned_streams, stream_rotary_tables
from engine.models.clip import EncoderLayer, TowerConfig
from engine.models.decoder import DecoderBackbone, DecoderConfig, DecoderVariant

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets

VISION_EPS = 1e-6  # the vision tower's LayerNorms (its config does not say)
# checkpoint module (under "visual.blocks.N.") -> ours
BLOCK_NAMES = {
    "norm1": "norm1",
    "norm2": "norm2",
    "attn.qkv": "qkv",
    "attn.proj": "attention_out",
    "mlp.fc1": "up",
    "mlp.fc2": "down",
}


@dataclass(frozen=True, slots=True)
class VisionConfig:
    tower: TowerConfig
    patch_size: int
    frames: int  # temporal patches (an image is repeated over them)
    merge: int  # merge x merge patches make one token
    out_size: int  # the decoder's hidden size
    rope_theta: float
    channels: int

    @classmethod
    def from_hf(cls, vision: Any) -> VisionConfig:
        embed, heads = vision.embed_dim, vision.num_heads
        if embed % heads or (embed // heads) % 4:
            raise UnsupportedModel(f"{vision.model_type}: heads of {embed / heads:g} dimensions")
        mlp = int(embed * vision.mlp_ratio)
        tower = TowerConfig(embed, vision.depth, heads, mlp, vision.hidden_act, VISION_EPS, 0)
        theta = (getattr(vision, "rope_parameters", None) or {}).get("rope_theta") or 10000.0
        return cls(
            tower=tower,
            patch_size=vision.patch_size,
            frames=vision.temporal_patch_size,
            merge=vision.spatial_merge_size,
            out_size=vision.hidden_size,
            rope_theta=float(theta),
            channels=vision.in_channels,
        )


@dataclass(frozen=True, slots=True)
class VisionLanguageConfig(DecoderConfig):
    vision: VisionConfig
    image_token_id: int  # an image's placeholder, one for each merged patch
    vision_start: int  # the tokens around an image's placeholders
    vision_end: int
    mrope_section: tuple[int, ...]  # rotary frequencies per stream: temporal, height, width

    @classmethod
    def parse(cls, hf_config: Any, variant: DecoderVariant, causal: bool) -> VisionLanguageConfig:
        text = hf_config.text_config
        decoder = DecoderConfig.from_hf(text, variant, causal)
        section = tuple((getattr(text, "rope_parameters", None) or {}).get("mrope_section") or ())
        if sum(section) != decoder.head_dim // 2 or len(section) != 3:
            raise UnsupportedModel(
                f"{hf_config.model_type}: mrope_section {list(section)} does not split "
                f"{decoder.head_dim // 2} rotary frequencies three ways"
            )
        fields = {field.name: getattr(decoder, field.name) for field in dataclasses.fields(DecoderConfig)}
        return cls(
            **fields,
            vision=VisionConfig.from_hf(hf_config.vision_config),
            image_token_id=hf_config.image_token_id,
            vision_start=hf_config.vision_start_token_id,
            vision_end=hf_config.vision_end_token_id,
            mrope_section=section,
        )


class VisionTower(nn.Module):
    """Patches -> merged image tokens: [num_patches, patch_dim] uint8 (in merge order) ->
    [num_patches / merge**2, out_size]."""

    def __init__(
        self,
        config: VisionConfig,
        attention_backend: AttentionBackend,
        affine: tuple[Sequence[float], Sequence[float]],
    ):
        super().__init__()
        self.config = config
        hidden = config.tower.hidden_size
        self.patch_embedding = PatchEmbedding(
            hidden, config.channels, config.patch_size, False, affine, frames=config.frames
        )
        self.blocks = nn.ModuleList(
            EncoderLayer(config.tower, attention_backend, False) for _ in range(config.tower.num_layers)
        )
        merged = hidden * config.merge**2
        self.merge_norm = nn.LayerNorm(hidden, eps=VISION_EPS)
        self.merge_up = nn.Linear(merged, merged)
        self.merge_down = nn.Linear(merged, config.out_size)

    def forward(self, pixels: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # pixels [num_patches, patch_dim], positions [2, num_patches] (each patch's row and column)
        hidden = self.patch_embedding(pixels)
        # 2-D rotary in float32: the first half of the frequencies turn by the row, the second by the column
        quarter = self.config.tower.head_dim // 4
        frequencies = inverse_frequencies(2 * quarter, self.config.rope_theta, pixels.device).repeat(2)
        streams = sectioned_streams((quarter, quarter))
        rotary = stream_rotary_tables(positions, frequencies, streams, torch.float32)
        for block in self.blocks:
            hidden = block(hidden, meta, rotary)
        merged = self.merge_norm(hidden).view(-1, self.merge_up.in_features)
        return self.merge_down(F.gelu(self.merge_up(merged)))


class VisionLanguageBackbone(DecoderBackbone):
    # transformers 5's names, then the checkpoints' ("model.layers...", "visual.blocks...")
    checkpoint_prefixes = ("model.language_model.", "model.")

    def __init__(
        self,
        config: VisionLanguageConfig,
        attention_backend: AttentionBackend,
        affine: tuple[Sequence[float], Sequence[float]],
    ):
        super().__init__(config, attention_backend)
        self.image_token = config.image_token_id
        # the vision tower's heads may be of a size the decoder's backend lacks (Qwen2-VL-2B's 80 against
        # FlashInfer's 64, 128 and 256): then it attends through torch's, which takes any
        vision_backend = attention_backend
        head_sizes = attention_backend.head_dims
        if head_sizes is not None and config.vision.tower.head_dim not in head_sizes:
            vision_backend = select_backend("torch", "cpu")  # device-agnostic
        self.visual = VisionTower(config.vision, vision_backend, affine)

    @classmethod
    def parse(
        cls, hf_config: Any, architecture: str, variant: DecoderVariant, causal: bool
    ) -> VisionLanguageConfig:
        return VisionLanguageConfig.parse(hf_config, variant, causal)

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> VisionLanguageBackbone:
        return cls(spec.config, attention_backend, spec.images.affine)

    @classmethod
    def window(cls, hf_config: Any, config: DecoderConfig) -> int:
        return hf_config.text_config.max_position_embeddings

    def after_load(self) -> None:
        self.visual.patch_embedding.reset_affine()

    def encode(
        self, batch: PackedBatch, meta: AttentionMetadata, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        images = batch.images
        if images is None:  # texts: every token's three positions are its position (Qwen2's rotary)
            return super().encode(batch, meta, rows)
        if not isinstance(images, InlineImages):
            raise ValueError("a vision-language batch's images sit inside its sequences")
        if images.pixels is None:  # a host batch run as it is (the runner moves a batch first)
            images = images.to(batch.input_ids.device)
        config: VisionLanguageConfig = self.config  # type: ignore[assignment]
        hidden = self.embed_tokens(batch.input_ids)
        vision_meta = AttentionMetadata.build(images.vision_cu_seqlens, images.vision_max_seqlen)
        merged = self.visual(images.pixels, images.vision_positions, vision_meta.to(hidden.device))
        hidden = hidden.index_copy(0, images.token_rows, merged.to(hidden.dtype))
        theta = config.rope_thetas["full_attention"]
        frequencies = inverse_frequencies(config.head_dim, theta, hidden.device)
        streams = sectioned_streams(config.mrope_section)
        rotary = stream_rotary_tables(images.positions, frequencies, streams, hidden.dtype)
        return self.run_layers(hidden, {"full_attention": rotary}, meta, rows)

    def weight_map(self) -> WeightTargets:
        targets = super().weight_map()
        tower = self.config.vision.tower
        modules = {
            "visual.merger.ln_q": "visual.merge_norm",
            "visual.merger.mlp.0": "visual.merge_up",
            "visual.merger.mlp.2": "visual.merge_down",
        }
        for index in range(tower.num_layers):
            source, target = f"visual.blocks.{index}.", f"visual.blocks.{index}."
            modules.update({source + name: target + module for name, module in BLOCK_NAMES.items()})
        targets.update(self.module_targets(modules))
        targets["visual.patch_embed.proj.weight"] = ("visual.patch_embedding.weight", None)
        return targets
