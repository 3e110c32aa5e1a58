"""Packed decoders (Qwen3, Qwen2, Llama, Mistral): a Backbone, causal (Qwen3-Embedding, gte-Qwen2,
e5-mistral, Qwen3-Reranker's judge) or bidirectional (pplx-embed style), each variant a record of
switches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, varlen_attention
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.layers.qk_norm_rotary import QKNormRotary
from engine.layers.rms_norm import AddRMSNorm, rms_norm
from engine.layers.rotary import rope_theta, rotary_tables
from engine.layers.swiglu import silu_and_mul
from engine.models.backbone import AttentionShape, Backbone, ClassifierLayout

if TYPE_CHECKING:
    from engine.loader import ModelSpec, WeightTargets


@dataclass(frozen=True, slots=True)
class DecoderVariant:
    """What sets a decoder family apart. A bias is a config attribute's name (False where the config
    lacks it) or fixed."""

    qk_norm: bool  # RMSNorm over each query and key head before rotary
    qkv_bias: str | bool
    out_bias: str | bool
    mlp_bias: str | bool = False
    # the config's `sliding_window` bounds the window, so that no query ever reaches past it
    sliding_window: bool = False


QWEN3 = DecoderVariant(qk_norm=True, qkv_bias="attention_bias", out_bias="attention_bias")
QWEN2 = DecoderVariant(qk_norm=False, qkv_bias=True, out_bias=False)
LLAMA = DecoderVariant(
    qk_norm=False, qkv_bias="attention_bias", out_bias="attention_bias", mlp_bias="mlp_bias"
)
MISTRAL = DecoderVariant(qk_norm=False, qkv_bias=False, out_bias=False, sliding_window=True)
VARIANTS = {"qwen3": QWEN3, "qwen2": QWEN2, "llama": LLAMA, "mistral": MISTRAL}


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    variant: DecoderVariant
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    causal: bool
    pad_token_id: int | None

    @classmethod
    def from_hf(cls, hf_config: Any, causal: bool) -> DecoderConfig:
        model_type = hf_config.model_type
        if model_type not in VARIANTS:
            raise UnsupportedModel(f"model type {model_type!r} is not a packed decoder")
        variant = VARIANTS[model_type]
        if getattr(hf_config, "use_sliding_window", False):
            raise UnsupportedModel(f"{model_type} with sliding-window layers is not supported")
        if hf_config.hidden_act not in ("silu", "swish"):
            raise UnsupportedModel(f"{model_type} with hidden_act {hf_config.hidden_act!r} is not supported")

        def bias(setting: str | bool) -> bool:
            return bool(getattr(hf_config, setting, False)) if isinstance(setting, str) else setting

        num_heads = hf_config.num_attention_heads
        return cls(
            variant=variant,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
            intermediate_size=hf_config.intermediate_size,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope_theta=rope_theta(hf_config),
            qkv_bias=bias(variant.qkv_bias),
            out_bias=bias(variant.out_bias),
            mlp_bias=bias(variant.mlp_bias),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            causal=causal,
            pad_token_id=getattr(hf_config, "pad_token_id", None),
        )


class DecoderAttention(nn.Module):
    """Fused QKV projection, rotary (after a per-head RMSNorm of queries and keys where the variant has
    it; one kernel on CUDA), grouped-query attention."""

    def __init__(self, config: DecoderConfig, attention_backend: AttentionBackend):
        super().__init__()
        self.causal = config.causal
        self.attention_backend = attention_backend
        qkv_size = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
        self.qkv = nn.Linear(config.hidden_size, qkv_size, bias=config.qkv_bias)
        self.qk_norm_rotary = QKNormRotary(
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.rms_norm_eps,
            config.variant.qk_norm,
        )
        out_size = config.num_heads * config.head_dim
        self.out = nn.Linear(out_size, config.hidden_size, bias=config.out_bias)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]
        num_tokens = hidden.shape[0]
        q, k, v = self.qk_norm_rotary(self.qkv(hidden), cos, sin)
        attention = varlen_attention(q, k, v, meta, backend=self.attention_backend, causal=self.causal)
        return self.out(attention.reshape(num_tokens, -1))


class DecoderMLP(nn.Module):
    """SwiGLU: gate and up projections as one GEMM, SiLU(gate) * up as one kernel on CUDA."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]
        return self.down(silu_and_mul(self.gate_up(hidden)))


class DecoderLayer(nn.Module):
    """Pre-norm block; each norm also adds the residual stream, which it hands on."""

    def __init__(self, config: DecoderConfig, attention_backend: AttentionBackend):
        super().__init__()
        self.attention_norm = AddRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = DecoderAttention(config, attention_backend)
        self.mlp_norm = AddRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DecoderMLP(config)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # [num_tokens, hidden] output of the last block and residual stream (None before the first
        # block) -> the same for this block
        hidden, residual = self.attention_norm(hidden, residual)
        hidden, residual = self.mlp_norm(self.attention(hidden, cos, sin, meta), residual)
        return self.mlp(hidden), residual


class DecoderBackbone(Backbone):
    """Token embeddings and pre-norm layers; the final RMSNorm is what it finishes with."""

    checkpoint_prefixes = ("model.",)
    pretraining_heads = ("lm_head.",)
    token_embeddings = "embed_tokens.weight"

    def __init__(self, config: DecoderConfig, attention_backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, attention_backend) for _ in range(config.num_layers))
        self.norm = AddRMSNorm(config.hidden_size, config.rms_norm_eps)

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> DecoderBackbone:
        return cls(DecoderConfig.from_hf(spec.hf_config, causal=not spec.bidirectional), attention_backend)

    @classmethod
    def check(cls, hf_config: Any) -> None:
        DecoderConfig.from_hf(hf_config, causal=True)

    @classmethod
    def attention_shape(cls, spec: ModelSpec) -> AttentionShape:
        config = DecoderConfig.from_hf(spec.hf_config, causal=not spec.bidirectional)
        return AttentionShape(config.num_heads, config.num_kv_heads, config.head_dim)

    @classmethod
    def window(cls, hf_config: Any) -> int:
        """The position table's length; with a sliding window (Mistral), at most the window, which a
        causal query then never reaches past."""
        window = hf_config.max_position_embeddings
        if VARIANTS.get(hf_config.model_type, QWEN3).sliding_window and getattr(
            hf_config, "sliding_window", None
        ):
            window = min(window, hf_config.sliding_window)
        return window

    def classifier_layout(self) -> ClassifierLayout:
        """*ForSequenceClassification: the last token that is not the pad token (as transformers picks
        it), finished, through `score` (no bias)."""
        return ClassifierLayout(
            out="score", out_bias=False, pooling="last", skip_token=self.config.pad_token_id
        )

    def encode(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden], before the final norm (the residual stream)
        hidden = self.embed_tokens(batch.input_ids)
        cos, sin = rotary_tables(batch.positions, self.config.head_dim, self.config.rope_theta, hidden.dtype)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, meta)
        return hidden + residual

    def finish(self, rows: torch.Tensor) -> torch.Tensor:
        # row-wise, so pooling one row per sequence first gives the same rows
        return rms_norm(rows, self.norm.weight, self.norm.eps)

    def weight_map(self) -> WeightTargets:
        config = self.config
        q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        modules = {"embed_tokens": "embed_tokens", "norm": "norm"}
        targets: WeightTargets = {}
        for index in range(config.num_layers):
            source, target = f"layers.{index}.", f"layers.{index}."
            modules.update({source + name: target + module for name, module in LAYER_NAMES.items()})
            if config.variant.qk_norm:
                modules.update({source + name: target + module for name, module in QK_NORM_NAMES.items()})
            qkv = {f"{source}self_attn.q_proj": q_rows, f"{source}self_attn.k_proj": kv_rows}
            qkv[f"{source}self_attn.v_proj"] = kv_rows
            targets.update(self.fused_targets(f"{target}attention.qkv", qkv))
            gate_up = {f"{source}mlp.{name}": config.intermediate_size for name in ("gate_proj", "up_proj")}
            targets.update(self.fused_targets(f"{target}mlp.gate_up", gate_up))
        return {**self.module_targets(modules), **targets}


# checkpoint module (under "layers.N.") -> ours
LAYER_NAMES = {
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "mlp_norm",
    "self_attn.o_proj": "attention.out",
    "mlp.down_proj": "mlp.down",
}
QK_NORM_NAMES = {
    "self_attn.q_norm": "attention.qk_norm_rotary.q_norm",
    "self_attn.k_norm": "attention.qk_norm_rotary.k_norm",
}
