"""Packed dual encoders (CLIP, SigLIP and SigLIP2 at a fixed resolution): a text tower and a vision tower
of pre-norm layers, each variant a record of switches and names. A text is a sequence of token ids; an
image is a sequence of its patches (engine/batch.ImageBatch), with a class token first where the variant
has one; both towers run packed, without padding."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, varlen_attention
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.layers.add_norm import AddLayerNorm
from engine.layers.linear_act import LinearActivation
from engine.layers.patch_embedding import PatchEmbedding
from engine.layers.pooling import cls_rows, last_rows, mean_pool
from engine.layers.qk_norm_rotary import QKNormRotary
from engine.models.backbone import AttentionShape, Backbone

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets

LAYER_NAMES = {
    "layer_norm1": "norm1",
    "self_attn.out_proj": "attention_out",
    "layer_norm2": "norm2",
    "mlp.fc1": "up",
    "mlp.fc2": "down",
}
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")


@dataclass(frozen=True, slots=True)
class DualEncoderVariant:
    """What sets a dual encoder apart: its text tower's mask and projection, its vision tower's class
    token, norms and pooling."""

    text_causal: bool  # CLIP's text tower is causal and pools its end-of-text token, the last one
    text_head: str  # the projection after the pooled text row, by its checkpoint name
    text_head_bias: bool
    class_token: bool  # a learned token before an image's patches, which the vision tower pools
    pre_norm: bool  # a LayerNorm over the vision embeddings ("pre_layrnorm")
    attention_pool: bool  # SigLIP: a learned probe attends over the patches (a MAP head), no projection
    patch_bias: bool
    # its texts are padded to the window with the pad token, as it was trained (SigLIP's processor pads to
    # max_length) and as it reads them: pooled at the last position, pads attended to
    pads_texts: bool
    ignored: tuple[str, ...]  # what the checkpoint holds beside the towers (the logit scale of training)
    # SigLIP2's NaFlex: images of any size and aspect up to its processor's max_num_patches, the patch
    # embedding a Linear over (row, column, channel) pixels, the square position table resampled to each
    # image's grid (bilinear, antialiased, as transformers' Siglip2VisionEmbeddings)
    naflex: bool = False


CLIP = DualEncoderVariant(
    text_causal=True,
    text_head="text_projection",
    text_head_bias=False,
    class_token=True,
    pre_norm=True,
    attention_pool=False,
    patch_bias=False,
    pads_texts=False,
    ignored=("logit_scale",),
)
SIGLIP = DualEncoderVariant(
    text_causal=False,
    text_head="text_model.head",
    text_head_bias=True,
    class_token=False,
    pre_norm=False,
    attention_pool=True,
    patch_bias=True,
    pads_texts=True,
    ignored=("logit_scale", "logit_bias"),
)
SIGLIP2 = replace(SIGLIP, naflex=True)


@dataclass(frozen=True, slots=True)
class TowerConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    num_positions: int

    @classmethod
    def from_hf(cls, config: Any, num_positions: int) -> TowerConfig:
        if config.hidden_size % config.num_attention_heads:
            raise UnsupportedModel(
                f"{config.model_type}: hidden_size is not a multiple of num_attention_heads"
            )
        return cls(
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.intermediate_size,
            config.hidden_act,
            config.layer_norm_eps,
            num_positions,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True, slots=True)
class DualEncoderConfig:
    variant: DualEncoderVariant
    text: TowerConfig
    vision: TowerConfig
    vocab_size: int
    projection_dim: int  # the width of both towers' rows
    image_size: int | None  # None: any (NaFlex)
    patch_size: int
    num_channels: int
    causal: bool = False  # the engine's prefix sharing reads this: never, for a dual encoder

    @classmethod
    def from_hf(cls, hf_config: Any, variant: DualEncoderVariant) -> DualEncoderConfig:
        text, vision = hf_config.text_config, hf_config.vision_config
        image_size = None if variant.naflex else getattr(vision, "image_size", None)
        if variant.naflex:  # its position table's entries, a square
            num_patches = vision.num_patches
            if round(num_patches**0.5) ** 2 != num_patches:
                raise UnsupportedModel(
                    f"{hf_config.model_type}: a position table of {num_patches}, not a square"
                )
        elif image_size is None:
            raise UnsupportedModel(f"{hf_config.model_type}: a vision tower without an image size")
        elif image_size % vision.patch_size:
            raise UnsupportedModel(f"{hf_config.model_type}: image_size is not a multiple of patch_size")
        else:
            num_patches = (image_size // vision.patch_size) ** 2
        if variant.attention_pool and not getattr(vision, "vision_use_head", True):
            raise UnsupportedModel(f"{hf_config.model_type}: a vision tower without its pooling head")
        width = getattr(hf_config, "projection_dim", None) or getattr(text, "projection_size", None)
        if variant.attention_pool and width != vision.hidden_size:
            raise UnsupportedModel(
                f"{hf_config.model_type}: text rows of {width}, image rows of {vision.hidden_size}"
            )
        return cls(
            variant=variant,
            text=TowerConfig.from_hf(text, text.max_position_embeddings),
            vision=TowerConfig.from_hf(vision, num_patches + variant.class_token),
            vocab_size=text.vocab_size,
            projection_dim=width or text.hidden_size,
            image_size=image_size,
            patch_size=vision.patch_size,
            num_channels=vision.num_channels,
        )


class EncoderLayer(nn.Module):
    """Pre-norm block: fused-QKV self-attention (queries and keys rotated in float32 by the tables a forward
    takes, in a block made `rotary`: Qwen2-VL's vision tower), then an MLP, each added to the residual
    stream. A block takes the last one's MLP rows and the stream before them, and its first norm adds them
    in the same pass (the stream after a tower's last block is its output and stream summed:
    `run_layers`)."""

    def __init__(
        self, config: TowerConfig, attention_backend: AttentionBackend, causal: bool, rotary: bool = False
    ):
        super().__init__()
        hidden_size, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.attention_backend = attention_backend
        self.causal = causal
        self.norm1 = AddLayerNorm(hidden_size, eps=eps)
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        # one Triton kernel on CUDA, in place (no weights); as many key heads as query heads
        self.rotary = (
            QKNormRotary(config.num_heads, config.num_heads, config.head_dim, eps, qk_norm=False)
            if rotary
            else None
        )
        self.attention_out = nn.Linear(hidden_size, hidden_size)
        self.norm2 = AddLayerNorm(hidden_size, eps=eps)
        self.up = LinearActivation(hidden_size, config.intermediate_size, config.hidden_act)
        self.down = nn.Linear(config.intermediate_size, hidden_size)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # [num_tokens, hidden] x2 (the first block: the embeddings and None) -> (the MLP's rows, the stream
        # before them), [num_tokens, hidden] each; rotary: float32 cos, sin [num_tokens, head_dim]
        num_tokens = hidden.shape[0]
        normed, residual = self.norm1.with_total(hidden, residual)
        qkv = self.qkv(normed)
        if rotary is not None:
            if self.rotary is None:
                raise ValueError("rotary tables given to a block made without rotary")
            q, k, v = self.rotary(qkv, *rotary)
        else:
            q, k, v = qkv.view(num_tokens, 3, self.num_heads, self.head_dim).unbind(1)
        attention = varlen_attention(q, k, v, meta, backend=self.attention_backend, causal=self.causal)
        attention = self.attention_out(attention.reshape(num_tokens, -1))
        normed, residual = self.norm2.with_total(attention, residual)
        return self.down(self.up(normed)), residual


def run_layers(
    layers: Sequence[EncoderLayer],
    hidden: torch.Tensor,
    meta: AttentionMetadata,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A tower's blocks over its embeddings -> (the last block's MLP rows, the stream before them), whose
    sum is the tower's output (its final norm adds them: AddLayerNorm)."""
    residual = None
    for layer in layers:
        hidden, residual = layer(hidden, residual, meta, rotary)
    return hidden, residual


def encoder_layer_targets(backbone: Backbone, source: str, target: str, config: TowerConfig) -> WeightTargets:
    """A tower's pre-norm layers as CLIP and SigLIP name them in a checkpoint (`source` + "N.") -> its
    EncoderLayers (`target` + "N."), the three attention projections into one QKV."""
    targets: WeightTargets = {}
    for index in range(config.num_layers):
        layer_source, layer_target = f"{source}{index}.", f"{target}{index}."
        names = {layer_source + name: layer_target + module for name, module in LAYER_NAMES.items()}
        projections = {layer_source + name: config.hidden_size for name in QKV}
        targets.update(backbone.module_targets(names))
        targets.update(backbone.fused_targets(f"{layer_target}qkv", projections))
    return targets


class AttentionPool(nn.Module):
    """SigLIP's MAP head over packed images: a learned probe attends over each image's tokens (a softmax
    per image and head), then out-projection, LayerNorm and an MLP added to it."""

    def __init__(self, config: TowerConfig):
        super().__init__()
        hidden_size = config.hidden_size
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.probe = nn.Parameter(torch.empty(1, 1, hidden_size))
        self.in_proj_weight = nn.Parameter(torch.empty(3 * hidden_size, hidden_size))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * hidden_size))
        self.out_proj = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=config.layer_norm_eps)
        self.up = LinearActivation(hidden_size, config.intermediate_size, config.hidden_act)
        self.down = nn.Linear(config.intermediate_size, hidden_size)

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_seqs, hidden]
        num_tokens, heads, dim = hidden.shape[0], self.num_heads, self.head_dim
        w_q, w_kv = self.in_proj_weight.split([hidden.shape[1], 2 * hidden.shape[1]])
        b_q, b_kv = self.in_proj_bias.split([hidden.shape[1], 2 * hidden.shape[1]])
        query = F.linear(self.probe.view(1, -1), w_q, b_q).view(heads, dim).float()
        k, v = F.linear(hidden, w_kv, b_kv).view(num_tokens, 2, heads, dim).float().unbind(1)
        scores = (k * query).sum(-1) * dim**-0.5  # [num_tokens, heads]
        segments = meta.segment_ids
        top = scores.new_full((meta.num_seqs, heads), float("-inf"))
        top = top.scatter_reduce(0, segments.unsqueeze(1).expand(-1, heads), scores, "amax")
        weights = (scores - top[segments]).exp()
        # the weighted sum over each image's tokens over the sum of its weights, both as segment means (the
        # counts cancel): on CUDA a kernel that reads each image's rows, where adding each token's row into
        # its image's by atomics took most of a ViT-B/16 batch's pooling
        pooled = mean_pool((weights.unsqueeze(2) * v).view(num_tokens, -1), meta)
        totals = mean_pool(weights, meta).clamp(min=1e-30)
        pooled = (pooled.view(-1, heads, dim) / totals.unsqueeze(2)).view(meta.num_seqs, -1).to(hidden.dtype)
        pooled = self.out_proj(pooled)
        return pooled + self.down(self.up(self.norm(pooled)))


class DualEncoderBackbone(Backbone):
    """Both towers; `text_rows` and `image_rows` give each input's projected row (not normalized)."""

    ignored_weights = ("text_model.embeddings.position_ids", "vision_model.embeddings.position_ids")

    def __init__(
        self,
        config: DualEncoderConfig,
        attention_backend: AttentionBackend,
        affine: tuple[Sequence[float], Sequence[float]],
    ):
        super().__init__()
        self.config = config
        variant, text, vision = config.variant, config.text, config.vision
        self.hidden_size = config.projection_dim
        self.ignored_weights = (*DualEncoderBackbone.ignored_weights, *variant.ignored)
        self.token_embedding = nn.Embedding(config.vocab_size, text.hidden_size)
        self.text_positions = nn.Embedding(text.num_positions, text.hidden_size)
        self.text_layers = nn.ModuleList(
            EncoderLayer(text, attention_backend, variant.text_causal) for _ in range(text.num_layers)
        )
        self.text_norm = AddLayerNorm(text.hidden_size, eps=text.layer_norm_eps)
        self.text_head = nn.Linear(text.hidden_size, config.projection_dim, bias=variant.text_head_bias)
        self.patch_embedding = PatchEmbedding(
            vision.hidden_size, config.num_channels, config.patch_size, variant.patch_bias, affine,
            channels_last=variant.naflex,
        )  # fmt: skip
        self.class_embedding = nn.Parameter(torch.empty(vision.hidden_size)) if variant.class_token else None
        self.image_positions = nn.Embedding(vision.num_positions, vision.hidden_size)
        self.pre_norm = (
            nn.LayerNorm(vision.hidden_size, eps=vision.layer_norm_eps) if variant.pre_norm else None
        )
        self.vision_layers = nn.ModuleList(
            EncoderLayer(vision, attention_backend, False) for _ in range(vision.num_layers)
        )
        self.vision_norm = AddLayerNorm(vision.hidden_size, eps=vision.layer_norm_eps)
        self.attention_pool = AttentionPool(vision) if variant.attention_pool else None
        self.image_head = (
            None
            if variant.attention_pool
            else nn.Linear(vision.hidden_size, config.projection_dim, bias=False)
        )

    @classmethod
    def parse(
        cls, hf_config: Any, architecture: str, variant: DualEncoderVariant, causal: bool
    ) -> DualEncoderConfig:
        return DualEncoderConfig.from_hf(hf_config, variant)

    def after_load(self) -> None:
        self.patch_embedding.prepare()

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> DualEncoderBackbone:
        return cls(spec.config, attention_backend, spec.images.affine)

    @classmethod
    def attention_shape(cls, spec: ModelSpec) -> AttentionShape:
        text, vision = spec.config.text, spec.config.vision
        if text.head_dim != vision.head_dim:  # one backend serves both towers
            raise UnsupportedModel(f"{spec.name}: towers of head sizes {text.head_dim} and {vision.head_dim}")
        return AttentionShape(
            max(text.num_heads, vision.num_heads), max(text.num_heads, vision.num_heads), text.head_dim
        )

    @classmethod
    def window(cls, hf_config: Any, config: DualEncoderConfig | None) -> int:
        return hf_config.text_config.max_position_embeddings

    def text_rows(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        # a batch of texts -> [num_seqs, projection_dim]: the last token's row (CLIP's end of text; SigLIP's
        # last position), normed and projected
        hidden = self.token_embedding(batch.input_ids) + self.text_positions(batch.positions)
        hidden, residual = run_layers(self.text_layers, hidden, meta)
        last = last_rows(meta, hidden.shape[0])
        return self.text_head(self.text_norm(hidden[last], residual[last]))

    def image_rows(
        self,
        pixels: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        grids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # a batch of images -> [num_seqs, projection_dim]: pixels [num_tokens, patch_dim] (zeros at a class
        # token, which the variant has at position 0), positions restarting at 0 an image; NaFlex's `grids`
        # [num_tokens, 2]: each token's image's rows and columns of patches. Shape-static: a CUDA graph
        # captures it (of fixed-size images)
        hidden = self.patch_embedding(pixels)
        if self.class_embedding is not None:
            is_class = (positions == 0).unsqueeze(1)
            hidden = torch.where(is_class, self.class_embedding.to(hidden.dtype), hidden)
        if self.config.variant.naflex:
            hidden = hidden + self.resampled_positions(positions, grids).to(hidden.dtype)
        else:
            hidden = hidden + self.image_positions(positions)
        if self.pre_norm is not None:
            hidden = self.pre_norm(hidden)
        hidden, residual = run_layers(self.vision_layers, hidden, meta)
        if self.attention_pool is not None:
            return self.attention_pool(self.vision_norm(hidden, residual), meta)
        first = cls_rows(meta, hidden.shape[0])
        return self.image_head(self.vision_norm(hidden[first], residual[first]))

    def resampled_positions(self, positions: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """[num_tokens, hidden] float32: each patch's entry of the square position table resized to its
        image's grid, bilinear and antialiased without aligned corners (F.interpolate's weights, as
        transformers' Siglip2VisionEmbeddings computes them): a weight per table row along the image's
        rows, one per table column along its columns."""
        side = round(self.config.vision.num_positions**0.5)
        sizes = grids.float()  # [num_tokens, 2]: rows, columns
        row = torch.div(positions, grids[:, 1], rounding_mode="floor")
        index = torch.stack([row, positions - row * grids[:, 1]], dim=1).float()  # [num_tokens, 2]
        scale = side / sizes
        support = scale.clamp(min=1)
        center = (index + 0.5) * scale - 0.5
        source = torch.arange(side, device=positions.device, dtype=torch.float32)
        weights = (1 - (source - center[..., None]).abs() / support[..., None]).clamp(min=0)
        weights = weights / weights.sum(-1, keepdim=True)  # [num_tokens, 2, side]
        both = (weights[:, 0, :, None] * weights[:, 1, None, :]).flatten(1)  # [num_tokens, side * side]
        return both @ self.image_positions.weight.float()

    def weight_map(self) -> WeightTargets:
        config, variant = self.config, self.config.variant
        modules = {
            "text_model.embeddings.token_embedding": "token_embedding",
            "text_model.embeddings.position_embedding": "text_positions",
            "text_model.final_layer_norm": "text_norm",
            variant.text_head: "text_head",
            "vision_model.embeddings.patch_embedding": "patch_embedding",
            "vision_model.embeddings.position_embedding": "image_positions",
            "vision_model.post_layernorm": "vision_norm",
        }
        if variant.pre_norm:
            modules["vision_model.pre_layrnorm"] = "pre_norm"
        if variant.attention_pool:
            modules.update({
                "vision_model.head.attention.out_proj": "attention_pool.out_proj",
                "vision_model.head.layernorm": "attention_pool.norm",
                "vision_model.head.mlp.fc1": "attention_pool.up",
                "vision_model.head.mlp.fc2": "attention_pool.down",
            })  # fmt: skip
        else:
            modules["visual_projection"] = "image_head"
        targets = {
            **encoder_layer_targets(self, "text_model.encoder.layers.", "text_layers.", config.text),
            **encoder_layer_targets(self, "vision_model.encoder.layers.", "vision_layers.", config.vision),
            **self.module_targets(modules),
        }
        if self.class_embedding is not None:
            targets["vision_model.embeddings.class_embedding"] = ("class_embedding", None)
        if variant.attention_pool:
            for name in ("probe", "attention.in_proj_weight", "attention.in_proj_bias"):
                targets[f"vision_model.head.{name}"] = (
                    f"attention_pool.{name.removeprefix('attention.')}",
                    None,
                )
        return targets
