"""PaliGemma, packed: ColPali's backbone. SigLIP's vision tower without its pooling head gives a row a patch
of an image of a fixed size; a Linear projects each into the Gemma decoder's width, and they take the rows
of the image's placeholder tokens, written before its text (`<image>` x 1024 then `<bos>Describe the
image.\\n`), unscaled where the text's embeddings are scaled. Unlike Qwen2-VL's M-RoPE, a token's rotary
position is its place from 1 (PaliGemma's positions are 1-indexed), and every token attends to every
other (ColPali's processor marks all of them as prefix, the block PaliGemma attends to both ways)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, for_head_dim
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.inline_images import InlineImages
from engine.layers.add_norm import AddLayerNorm
from engine.layers.patch_embedding import PatchEmbedding
from engine.models import decoder
from engine.models.clip import EncoderLayer, TowerConfig, encoder_layer_targets, run_layers
from engine.models.decoder import DecoderBackbone, DecoderConfig

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets

# Gemma's decoder, every token attending both ways whatever its config says
TEXT = dataclasses.replace(decoder.GEMMA, bidirectional=None)
# the one architecture it is served as: the bare model under ColPali's projection
BARE = "PaliGemmaModel"
VISION = "vision_tower."


@dataclass(frozen=True, slots=True)
class PaliGemmaConfig(DecoderConfig):
    vision: TowerConfig  # num_positions: an image's patches
    image_size: int
    patch_size: int
    channels: int
    image_token_id: int  # an image's placeholder, one for each patch
    # no tokens mark where an image starts or ends (Qwen2-VL's <|vision_start|> and <|vision_end|>)
    vision_start: int | None = None
    vision_end: int | None = None

    @classmethod
    def parse(cls, hf_config: Any, architecture: str) -> PaliGemmaConfig:
        text, vision = hf_config.text_config, hf_config.vision_config
        model_type = hf_config.model_type
        if architecture != BARE:
            raise UnsupportedModel(
                f"{architecture}: posy serves PaliGemma as ColPali's backbone (ColPaliForRetrieval), not "
                "as a generative model"
            )
        if text.model_type != "gemma":
            raise UnsupportedModel(f"{model_type} over {text.model_type} is not supported (over Gemma it is)")
        if vision.image_size % vision.patch_size:
            raise UnsupportedModel(f"{model_type}: image_size is not a multiple of patch_size")
        if hf_config.projection_dim != text.hidden_size:
            raise UnsupportedModel(
                f"{model_type}: image rows projected to {hf_config.projection_dim}, its decoder's are "
                f"{text.hidden_size}"
            )
        decoder_config = DecoderConfig.from_hf(text, TEXT, causal=False)
        fields = {item.name: getattr(decoder_config, item.name) for item in dataclasses.fields(DecoderConfig)}
        return cls(
            **fields,
            vision=TowerConfig.from_hf(vision, (vision.image_size // vision.patch_size) ** 2),
            image_size=vision.image_size,
            patch_size=vision.patch_size,
            channels=vision.num_channels,
            image_token_id=hf_config.image_token_id,
        )


class SiglipPatches(nn.Module):
    """SigLIP's vision tower without its pooling head: [num_patches, patch_dim] uint8 pixels -> a
    post-normed row a patch, [num_patches, hidden]."""

    def __init__(
        self,
        config: PaliGemmaConfig,
        attention_backend: AttentionBackend,
        affine: tuple[Sequence[float], Sequence[float]],
    ):
        super().__init__()
        tower = config.vision
        hidden = tower.hidden_size
        self.patch_embedding = PatchEmbedding(hidden, config.channels, config.patch_size, True, affine)
        self.positions = nn.Embedding(tower.num_positions, hidden)
        self.layers = nn.ModuleList(
            EncoderLayer(tower, attention_backend, False) for _ in range(tower.num_layers)
        )
        self.norm = AddLayerNorm(hidden, eps=tower.layer_norm_eps)

    def forward(self, pixels: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # positions: [num_patches] each patch's index in its image, row by row
        hidden = self.patch_embedding(pixels) + self.positions(positions)
        hidden, residual = run_layers(self.layers, hidden, meta)
        return self.norm(hidden, residual)


class PaliGemmaBackbone(DecoderBackbone):
    # the names of transformers 5's loaded model (under ColPali's "vlm."), of its saved one (the language
    # model's under "language_model.model."), and of the hub's checkpoints' ("vlm.model.", each under "vlm.")
    checkpoint_prefixes = (
        "model.language_model.model.", "model.language_model.", "model.", "language_model.model.",
        "language_model.",
    )  # fmt: skip
    renamed_prefixes = (("vision_tower.vision_model.", VISION),)
    ignored_weights = (f"{VISION}embeddings.position_ids", f"{VISION}head.")

    def __init__(
        self,
        config: PaliGemmaConfig,
        attention_backend: AttentionBackend,
        affine: tuple[Sequence[float], Sequence[float]],
    ):
        super().__init__(config, attention_backend)
        self.image_token = config.image_token_id
        self.vision = SiglipPatches(config, for_head_dim(attention_backend, config.vision.head_dim), affine)
        self.projector = nn.Linear(config.vision.hidden_size, config.hidden_size)

    @classmethod
    def parse(cls, hf_config: Any, architecture: str, variant: Any, causal: bool) -> PaliGemmaConfig:
        return PaliGemmaConfig.parse(hf_config, architecture)

    @classmethod
    def config_bidirectional(cls, hf_config: Any, variant: Any) -> bool:
        return True

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> PaliGemmaBackbone:
        return cls(spec.config, attention_backend, spec.images.affine)

    @classmethod
    def window(cls, hf_config: Any, config: DecoderConfig) -> int:
        return hf_config.text_config.max_position_embeddings

    def after_load(self) -> None:
        self.vision.patch_embedding.prepare()

    def encode(
        self, batch: PackedBatch, meta: AttentionMetadata, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        hidden = self.embed(batch.input_ids)
        images = batch.images
        if images is not None:
            if not isinstance(images, InlineImages):
                raise ValueError("a PaliGemma batch's images sit inside its sequences")
            if images.pixels is None:  # a host batch run as it is (the runner moves a batch first)
                images = images.to(batch.input_ids.device)
            # a patch's index in its image, row by row (inline_images' order, of one patch a token)
            rows_columns, grids = images.vision_positions, images.vision_grids
            positions = rows_columns[0] * grids[1] + rows_columns[1]
            vision_meta = AttentionMetadata.build(images.vision_cu_seqlens, images.vision_max_seqlen)
            patches = self.vision(images.pixels, positions, vision_meta.to(hidden.device))
            projected = images.placed(self.projector(patches))
            hidden = hidden.index_copy(0, images.token_rows, projected.to(hidden.dtype))
        return self.run_embedded(hidden, batch.positions + 1, meta, rows)

    def weight_map(self) -> WeightTargets:
        targets = super().weight_map()
        tower = self.config.vision
        modules = {
            f"{VISION}embeddings.patch_embedding": "vision.patch_embedding",
            f"{VISION}embeddings.position_embedding": "vision.positions",
            f"{VISION}post_layernorm": "vision.norm",
            "multi_modal_projector.linear": "projector",
        }
        targets.update(encoder_layer_targets(self, f"{VISION}encoder.layers.", "vision.layers.", tower))
        targets.update(self.module_targets(modules))
        return targets
