"""Vision-language backbones (Qwen2-VL: gme-Qwen2-VL's embeddings, the base of jina-reranker-m0 and
ColQwen2; Qwen3-VL: Qwen3-VL-Embedding's), each variant a record of switches and names: a packed decoder
(Qwen2's, Qwen3's) whose image placeholder tokens take the rows of its vision tower's merged patches,
under multimodal rotary positions (M-RoPE: a temporal, a height and a width position a token, each over
its share of the rotary frequencies; a text token's three are its position, so a batch of texts runs as
the plain decoder does). The vision tower runs the batch's images as sequences of their own: patches
(engine/layers/patch_embedding.py), Qwen3-VL's learned position table resampled to each image's grid,
2-D rotary, CLIP's pre-norm blocks, then a merger of each merge x merge group of patches into one token
(engine/inline_images.py lays them out); Qwen3-VL's chosen blocks' states, merged apart (DeepStack), are
added to the image rows of its first decoder layers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, for_head_dim
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.inline_images import InlineImages
from engine.layers.patch_embedding import PatchEmbedding
from engine.layers.rotary import (
    interleaved_streams,
    inverse_frequencies,
    sectioned_streams,
    stream_rotary_tables,
)
from engine.models import decoder
from engine.models.clip import EncoderLayer, TowerConfig
from engine.models.decoder import DecoderBackbone, DecoderConfig, DecoderVariant

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets

VISION_EPS = 1e-6  # the vision tower's LayerNorms (its config does not say)


@dataclass(frozen=True, slots=True)
class VisionLanguageVariant:
    """What sets a vision-language family apart: its decoder, and its vision tower's parts and names."""

    decoder: DecoderVariant
    patch_bias: bool
    position_table: bool  # a learned square table of positions, resampled to each image's grid (bilinear)
    interleaved_rope: bool  # M-RoPE's streams take turns over the frequencies (else consecutive sections)
    mlp_names: tuple[str, str]  # a vision block's MLP projections
    merger_names: tuple[str, str, str]  # the merger's norm and two projections
    # the system turn before each input, as its embedders lay them out (None: the chat template's default:
    # gme-Qwen2-VL's; Qwen3-VL-Embedding's own)
    instruction: str | None = None


QWEN2_VL = VisionLanguageVariant(
    decoder=decoder.QWEN2,
    patch_bias=False,
    position_table=False,
    interleaved_rope=False,
    mlp_names=("mlp.fc1", "mlp.fc2"),
    merger_names=("ln_q", "mlp.0", "mlp.2"),
)
QWEN3_VL = VisionLanguageVariant(
    decoder=decoder.QWEN3,
    patch_bias=True,
    position_table=True,
    interleaved_rope=True,
    mlp_names=("mlp.linear_fc1", "mlp.linear_fc2"),
    merger_names=("norm", "linear_fc1", "linear_fc2"),
    instruction="Represent the user's input.",
)


@dataclass(frozen=True, slots=True)
class VisionConfig:
    tower: TowerConfig
    patch_size: int
    frames: int  # temporal patches (an image is repeated over them)
    merge: int  # merge x merge patches make one token
    out_size: int  # the decoder's hidden size
    rope_theta: float
    channels: int
    positions: int  # the learned position table's entries (a square); 0: none
    deepstack: tuple[int, ...]  # the blocks whose states are merged apart and added to the decoder's layers

    @classmethod
    def from_hf(cls, vision: Any) -> VisionConfig:
        if hasattr(vision, "embed_dim"):  # Qwen2-VL's names: its hidden_size is the decoder's
            embed, out = vision.embed_dim, vision.hidden_size
            mlp = int(embed * vision.mlp_ratio)
        else:
            embed, out, mlp = vision.hidden_size, vision.out_hidden_size, vision.intermediate_size
        heads = vision.num_heads
        if embed % heads or (embed // heads) % 4:
            raise UnsupportedModel(f"{vision.model_type}: heads of {embed / heads:g} dimensions")
        tower = TowerConfig(embed, vision.depth, heads, mlp, vision.hidden_act, VISION_EPS, 0)
        theta = (getattr(vision, "rope_parameters", None) or {}).get("rope_theta") or 10000.0
        positions = getattr(vision, "num_position_embeddings", 0) or 0
        if positions and round(positions**0.5) ** 2 != positions:
            raise UnsupportedModel(f"{vision.model_type}: a position table of {positions}, not a square")
        return cls(
            tower=tower,
            patch_size=vision.patch_size,
            frames=vision.temporal_patch_size,
            merge=vision.spatial_merge_size,
            out_size=out,
            rope_theta=float(theta),
            channels=vision.in_channels,
            positions=positions,
            deepstack=tuple(getattr(vision, "deepstack_visual_indexes", None) or ()),
        )


@dataclass(frozen=True, slots=True)
class VisionLanguageConfig(DecoderConfig):
    vision: VisionConfig
    family: VisionLanguageVariant
    image_token_id: int  # an image's placeholder, one for each merged patch
    vision_start: int  # the tokens around an image's placeholders
    vision_end: int
    rope_streams: tuple[int, ...]  # each rotary frequency's M-RoPE stream: 0 temporal, 1 height, 2 width

    @classmethod
    def parse(cls, hf_config: Any, variant: VisionLanguageVariant, causal: bool) -> VisionLanguageConfig:
        text = hf_config.text_config
        decoder_config = DecoderConfig.from_hf(text, variant.decoder, causal)
        section = tuple((getattr(text, "rope_parameters", None) or {}).get("mrope_section") or ())
        if sum(section) != decoder_config.head_dim // 2 or len(section) != 3:
            raise UnsupportedModel(
                f"{hf_config.model_type}: mrope_section {list(section)} does not split "
                f"{decoder_config.head_dim // 2} rotary frequencies three ways"
            )
        streams = interleaved_streams(section) if variant.interleaved_rope else sectioned_streams(section)
        fields = {item.name: getattr(decoder_config, item.name) for item in dataclasses.fields(DecoderConfig)}
        return cls(
            **fields,
            vision=VisionConfig.from_hf(hf_config.vision_config),
            family=variant,
            image_token_id=hf_config.image_token_id,
            vision_start=hf_config.vision_start_token_id,
            vision_end=hf_config.vision_end_token_id,
            rope_streams=tuple(streams),
        )


class Merger(nn.Module):
    """merge x merge patches' states -> one token: a LayerNorm (of each patch's state, or after the
    shuffle of the group's: DeepStack's), then an MLP with GELU."""

    def __init__(self, config: VisionConfig, after_shuffle: bool):
        super().__init__()
        hidden = config.tower.hidden_size
        merged = hidden * config.merge**2
        self.after_shuffle = after_shuffle
        self.norm = nn.LayerNorm(merged if after_shuffle else hidden, eps=VISION_EPS)
        self.up = nn.Linear(merged, merged)
        self.down = nn.Linear(merged, config.out_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # [num_patches, hidden] (in merge order) -> [num_patches / merge**2, out_size]
        width = self.up.in_features
        merged = (
            self.norm(hidden.view(-1, width)) if self.after_shuffle else self.norm(hidden).view(-1, width)
        )
        return self.down(F.gelu(self.up(merged)))


class VisionTower(nn.Module):
    """Patches -> merged image tokens: [num_patches, patch_dim] uint8 (in merge order) ->
    [num_patches / merge**2, out_size], and DeepStack's merged states of its chosen blocks."""

    def __init__(
        self,
        config: VisionConfig,
        variant: VisionLanguageVariant,
        attention_backend: AttentionBackend,
        affine: tuple[Sequence[float], Sequence[float]],
    ):
        super().__init__()
        self.config = config
        hidden = config.tower.hidden_size
        self.patch_embedding = PatchEmbedding(
            hidden, config.channels, config.patch_size, variant.patch_bias, affine, frames=config.frames
        )
        self.position_table = nn.Embedding(config.positions, hidden) if config.positions else None
        self.blocks = nn.ModuleList(
            EncoderLayer(config.tower, attention_backend, False, rotary=True)
            for _ in range(config.tower.num_layers)
        )
        self.merger = Merger(config, after_shuffle=False)
        self.deepstack = nn.ModuleList(Merger(config, after_shuffle=True) for _ in config.deepstack)

    def forward(
        self, pixels: torch.Tensor, images: InlineImages, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        hidden = self.patch_embedding(pixels)
        positions = images.vision_positions  # [2, num_patches]: each patch's row and column
        if self.position_table is not None:
            hidden = hidden + self.resampled_positions(positions, images.vision_grids).to(hidden.dtype)
        # 2-D rotary in float32: the first half of the frequencies turn by the row, the second by the column
        quarter = self.config.tower.head_dim // 4
        frequencies = inverse_frequencies(2 * quarter, self.config.rope_theta, pixels.device).repeat(2)
        streams = sectioned_streams((quarter, quarter))
        rotary = stream_rotary_tables(positions, frequencies, streams, torch.float32)
        deepstack, residual = [], None
        for index, block in enumerate(self.blocks):
            hidden, residual = block(hidden, residual, meta, rotary)
            if index in self.config.deepstack:  # the block's output: its MLP rows added to the stream
                deepstack.append(self.deepstack[self.config.deepstack.index(index)](hidden + residual))
        return self.merger(hidden + residual), deepstack

    def resampled_positions(self, positions: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """Each patch's entry of the square position table resampled (bilinear, corners aligned) to its
        image's grid: [2, num_patches] row, column and [2, num_patches] its image's rows, columns ->
        [num_patches, hidden] float32."""
        side = round(self.config.positions**0.5)
        taps, weights = [], []
        for index, size in zip(positions, grids):
            source = index.float() * (side - 1) / (size - 1).clamp(min=1)
            floor = source.floor()
            offsets = torch.arange(2, device=index.device)
            taps.append((floor.long()[:, None] + offsets).clamp(0, side - 1))
            weights.append((1 - (source[:, None] - floor[:, None] - offsets).abs()).clamp(min=0))
        rows, columns = taps
        entries = (rows[:, :, None] * side + columns[:, None, :]).flatten(1)
        scale = (weights[0][:, :, None] * weights[1][:, None, :]).flatten(1)
        return (self.position_table(entries) * scale[:, :, None]).sum(1)


class VisionLanguageBackbone(DecoderBackbone):
    # transformers 5's names, then the checkpoints' ("model.layers...", "visual.blocks..."), then a bare
    # Qwen2VLModel's ("language_model.layers...", as ColQwen2 wraps one)
    checkpoint_prefixes = ("model.language_model.", "model.", "language_model.")

    def __init__(
        self,
        config: VisionLanguageConfig,
        attention_backend: AttentionBackend,
        affine: tuple[Sequence[float], Sequence[float]],
    ):
        super().__init__(config, attention_backend)
        self.image_token = config.image_token_id
        # the vision tower's heads may be of a size the decoder's backend lacks (Qwen2-VL-2B's 80 against
        # FlashInfer's 64, 128 and 256, where Triton's hands an image's long sequence to FlashInfer)
        vision_backend = for_head_dim(attention_backend, config.vision.tower.head_dim)
        self.visual = VisionTower(config.vision, config.family, vision_backend, affine)

    @classmethod
    def parse(
        cls, hf_config: Any, architecture: str, variant: VisionLanguageVariant, causal: bool
    ) -> VisionLanguageConfig:
        return VisionLanguageConfig.parse(hf_config, variant, causal)

    @classmethod
    def config_bidirectional(cls, hf_config: Any, variant: VisionLanguageVariant) -> bool:
        return DecoderBackbone.config_bidirectional(hf_config.text_config, variant.decoder)

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> VisionLanguageBackbone:
        return cls(spec.config, attention_backend, spec.images.affine)

    @classmethod
    def window(cls, hf_config: Any, config: DecoderConfig) -> int:
        return hf_config.text_config.max_position_embeddings

    def after_load(self) -> None:
        self.visual.patch_embedding.prepare()

    def encode(
        self, batch: PackedBatch, meta: AttentionMetadata, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        images = batch.images
        if images is None:  # texts: every token's three positions are its position (the plain decoder's)
            return super().encode(batch, meta, rows)
        if not isinstance(images, InlineImages):
            raise ValueError("a vision-language batch's images sit inside its sequences")
        if images.pixels is None:  # a host batch run as it is (the runner moves a batch first)
            images = images.to(batch.input_ids.device)
        config: VisionLanguageConfig = self.config  # type: ignore[assignment]
        hidden = self.embed(batch.input_ids)
        vision_meta = AttentionMetadata.build(images.vision_cu_seqlens, images.vision_max_seqlen)
        merged, deepstack = self.visual(images.pixels, images, vision_meta.to(hidden.device))
        hidden = hidden.index_copy(0, images.token_rows, images.placed(merged).to(hidden.dtype))
        theta = config.rope_thetas["full_attention"]
        frequencies = inverse_frequencies(config.head_dim, theta, hidden.device)
        rotary = stream_rotary_tables(images.positions, frequencies, config.rope_streams, hidden.dtype)
        added = [(images.token_rows, images.placed(feature).to(hidden.dtype)) for feature in deepstack]
        # the last layer gives every row where DeepStack adds to it (a decoder of no more layers)
        whole = rows is not None and len(added) >= len(self.layers)
        encoded = self.run_layers(hidden, {"full_attention": rotary}, meta, None if whole else rows, added)
        return encoded[rows] if whole else encoded

    def weight_map(self) -> WeightTargets:
        targets = super().weight_map()
        variant, vision = self.config.family, self.config.vision
        norm, up, down = variant.merger_names
        mlp_up, mlp_down = variant.mlp_names
        block_names = {
            "norm1": "norm1", "norm2": "norm2", "attn.qkv": "qkv", "attn.proj": "attention_out",
            mlp_up: "up", mlp_down: "down",
        }  # fmt: skip
        modules = {f"visual.merger.{name}": f"visual.merger.{ours}" for name, ours in zip(
            (norm, up, down), ("norm", "up", "down")
        )}  # fmt: skip
        for index in range(len(vision.deepstack)):
            for name, ours in zip(("norm", "linear_fc1", "linear_fc2"), ("norm", "up", "down")):
                modules[f"visual.deepstack_merger_list.{index}.{name}"] = f"visual.deepstack.{index}.{ours}"
        for index in range(vision.tower.num_layers):
            source = target = f"visual.blocks.{index}."
            modules.update({source + name: target + module for name, module in block_names.items()})
        modules["visual.patch_embed.proj"] = "visual.patch_embedding"
        if vision.positions:
            modules["visual.pos_embed"] = "visual.position_table"
        targets.update(self.module_targets(modules))
        return targets
