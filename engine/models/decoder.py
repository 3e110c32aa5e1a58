"""Packed decoders (Qwen3, Qwen2, Llama, Mistral, Gemma, Gemma3): a Backbone, causal (Qwen3-Embedding,
gte-Qwen2, e5-mistral, Qwen3-Reranker's judge) or bidirectional (pplx-embed style, EmbeddingGemma), each
variant a record of switches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, varlen_attention
from engine.batch import PackedBatch
from engine.checkpoint.files import ties_word_embeddings
from engine.errors import UnsupportedModel
from engine.layers.fp8 import NEVER, fp8_rows_from
from engine.layers.qk_norm_rotary import QKNormRotary
from engine.layers.rms_norm import AddRMSNorm, rms_norm
from engine.layers.rotary import rope_theta, rotary_tables
from engine.layers.swiglu import gated
from engine.models.backbone import AttentionShape, Backbone, ClassifierLayout

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets


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
    activation: str = "hidden_act"  # the config attribute naming the MLP gate's activation
    norm_offset: bool = False  # every RMSNorm scales by 1 + weight, in float32 (Gemma's norms)
    sandwich_norms: bool = False  # the attention's and the MLP's outputs are normalized too
    embed_scale: bool = False  # token embeddings times sqrt(hidden_size), rounded to the model dtype
    attention_scale: str | None = None  # a config attribute s: softmax scale s ** -0.5, not head_dim's
    # the config's `layer_types`: "sliding_attention" layers see `sliding_window` keys, and each type has
    # its own rotary base
    layer_types: bool = False
    bidirectional: str | None = None  # a config attribute that makes the model (every head) bidirectional
    float16: bool = True  # False: its activations overflow float16


QWEN3 = DecoderVariant(qk_norm=True, qkv_bias="attention_bias", out_bias="attention_bias")
# pplx-embed (its remote PPLXQwen3Model): Qwen3's, bidirectional as its config's use_bidirectional_attention
# says
PPLX_QWEN3 = replace(QWEN3, bidirectional="use_bidirectional_attention")
QWEN2 = DecoderVariant(qk_norm=False, qkv_bias=True, out_bias=False)
LLAMA = DecoderVariant(
    qk_norm=False, qkv_bias="attention_bias", out_bias="attention_bias", mlp_bias="mlp_bias"
)
MISTRAL = DecoderVariant(qk_norm=False, qkv_bias=False, out_bias=False, sliding_window=True)
GEMMA3 = DecoderVariant(
    qk_norm=True,
    qkv_bias="attention_bias",
    out_bias="attention_bias",
    activation="hidden_activation",
    norm_offset=True,
    sandwich_norms=True,
    embed_scale=True,
    attention_scale="query_pre_attn_scalar",
    layer_types=True,
    bidirectional="use_bidirectional_attention",
    float16=False,
)
# Gemma (1): Gemma3's norms and embedding scale, without its query/key norms, sandwich norms or layer types
GEMMA = DecoderVariant(
    qk_norm=False,
    qkv_bias="attention_bias",
    out_bias="attention_bias",
    norm_offset=True,
    embed_scale=True,
    bidirectional="use_bidirectional_attention",
    float16=False,
)
# HF activation names -> the gated activation (engine/layers/swiglu.py) that computes them
GATE_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
}
LAYER_TYPES = ("full_attention", "sliding_attention")
# config values that change the scores posy computes, which it does not implement (Gemma2's softcapping;
# Gemma3's final_logit_softcapping touches only the LM head's logits, which no head posy runs reads)
UNSUPPORTED_SETTINGS = ("attn_logit_softcapping",)


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
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    causal: bool
    pad_token_id: int | None
    activation: str  # one of engine/layers/swiglu.py's GATE_ACTIVATIONS
    layer_types: tuple[str, ...]  # one per layer: "full_attention" or "sliding_attention"
    rope_thetas: dict[str, float]  # layer type -> rotary base
    window: tuple[int, int] | None  # (left, right) keys a sliding layer's query sees; None: no such layer
    attention_scale: float | None  # None: 1 / sqrt(head_dim)

    @classmethod
    def from_hf(cls, hf_config: Any, variant: DecoderVariant, causal: bool) -> DecoderConfig:
        """`causal` is the mask asked for; a variant with a `bidirectional` switch takes its config's."""
        model_type = hf_config.model_type
        if getattr(hf_config, "use_sliding_window", False):
            raise UnsupportedModel(f"{model_type} with sliding-window layers is not supported")
        activation = getattr(hf_config, variant.activation, None)
        if activation not in GATE_ACTIVATIONS:
            raise UnsupportedModel(f"{model_type} with {variant.activation} {activation!r} is not supported")
        for setting in UNSUPPORTED_SETTINGS:
            value = getattr(hf_config, setting, None)
            if value is not None:
                raise UnsupportedModel(f"{model_type} with {setting} {value!r} is not supported")
        if variant.bidirectional is not None:
            causal = not getattr(hf_config, variant.bidirectional, False)

        def bias(setting: str | bool) -> bool:
            return bool(getattr(hf_config, setting, False)) if isinstance(setting, str) else setting

        num_heads = hf_config.num_attention_heads
        layer_types, window = layer_windows(hf_config, variant, causal)
        if variant.layer_types:
            rope_thetas = {kind: rope_theta(hf_config, kind) for kind in dict.fromkeys(layer_types)}
        else:
            rope_thetas = {"full_attention": rope_theta(hf_config)}
        scale = getattr(hf_config, variant.attention_scale) if variant.attention_scale else None
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
            qkv_bias=bias(variant.qkv_bias),
            out_bias=bias(variant.out_bias),
            mlp_bias=bias(variant.mlp_bias),
            tie_word_embeddings=ties_word_embeddings(hf_config),
            causal=causal,
            pad_token_id=getattr(hf_config, "pad_token_id", None),
            activation=GATE_ACTIVATIONS[activation],
            layer_types=layer_types,
            rope_thetas=rope_thetas,
            window=window,
            attention_scale=None if scale is None else float(scale) ** -0.5,
        )


def layer_windows(
    hf_config: Any, variant: DecoderVariant, causal: bool
) -> tuple[tuple[str, ...], tuple[int, int] | None]:
    """(each layer's type, the sliding layers' (left, right) window), as transformers' masks have them."""
    num_layers = hf_config.num_hidden_layers
    if not variant.layer_types:
        return ("full_attention",) * num_layers, None
    layer_types = tuple(getattr(hf_config, "layer_types", None) or ())
    if len(layer_types) != num_layers or set(layer_types) - set(LAYER_TYPES):
        raise UnsupportedModel(f"{hf_config.model_type}: unsupported layer_types {list(layer_types)}")
    if "sliding_attention" not in layer_types:
        return layer_types, None
    size = getattr(hf_config, "sliding_window", None)
    if not isinstance(size, int) or size < 1:
        raise UnsupportedModel(f"{hf_config.model_type}: sliding layers without a sliding_window ({size!r})")
    # causal: key > query - size (and key <= query), so size - 1 keys back. Bidirectional (Gemma3):
    # |query - key| < size, where the config keeps size = W // 2 + 1 of the W in config.json, so W // 2
    # keys on each side
    return layer_types, ((size - 1, 0) if causal else (size - 1, size - 1))


class DecoderAttention(nn.Module):
    """Fused QKV projection, rotary (after a per-head RMSNorm of queries and keys where the variant has
    it; one kernel on CUDA), grouped-query attention."""

    def __init__(self, config: DecoderConfig, index: int, attention_backend: AttentionBackend):
        super().__init__()
        self.causal = config.causal
        self.window = config.window if config.layer_types[index] == "sliding_attention" else None
        self.scale = config.attention_scale
        self.attention_backend = attention_backend
        qkv_size = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
        self.qkv = nn.Linear(config.hidden_size, qkv_size, bias=config.qkv_bias)
        self.qk_norm_rotary = QKNormRotary(
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.rms_norm_eps,
            config.variant.qk_norm,
            config.variant.norm_offset,
        )
        out_size = config.num_heads * config.head_dim
        self.out = nn.Linear(out_size, config.hidden_size, bias=config.out_bias)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]; with `rows`, [len(rows), hidden] of those rows
        num_tokens = hidden.shape[0]
        q, k, v = self.qk_norm_rotary(self.qkv(hidden), cos, sin)
        attention = varlen_attention(
            q, k, v, meta, backend=self.attention_backend, causal=self.causal, window=self.window,
            scale=self.scale,
        )  # fmt: skip
        attention = attention.reshape(num_tokens, -1)
        return self.out(attention if rows is None else attention[rows])


class DecoderMLP(nn.Module):
    """A gated MLP (SwiGLU; GELU-tanh for Gemma3): gate and up projections as one GEMM, act(gate) * up as
    one kernel on CUDA."""

    # the rows from which the down projection runs in FP8: the gated product then comes as its Fp8Rows
    quantize_from: float = NEVER

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.activation = config.activation
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]
        quantize = hidden.shape[0] >= self.quantize_from
        return self.down(gated(self.gate_up(hidden), self.activation, quantize=quantize))


class DecoderLayer(nn.Module):
    """Pre-norm block; each pre-norm also adds the residual stream, which it hands on. With sandwich norms
    (Gemma3) the attention's and the MLP's outputs are normalized too, before they join the stream."""

    def __init__(self, config: DecoderConfig, index: int, attention_backend: AttentionBackend):
        super().__init__()
        size, eps, offset = config.hidden_size, config.rms_norm_eps, config.variant.norm_offset
        self.layer_type = config.layer_types[index]
        self.attention_norm = AddRMSNorm(size, eps, offset)
        self.attention = DecoderAttention(config, index, attention_backend)
        self.mlp_norm = AddRMSNorm(size, eps, offset)
        self.mlp = DecoderMLP(config)
        # AddRMSNorm without a residual: one kernel on CUDA
        sandwich = config.variant.sandwich_norms
        self.attention_out_norm = AddRMSNorm(size, eps, offset) if sandwich else None
        self.mlp_out_norm = AddRMSNorm(size, eps, offset) if sandwich else None

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # [num_tokens, hidden] output of the last block and residual stream (None before the first
        # block) -> the same for this block; with `rows`, [len(rows), hidden] of those rows
        hidden, residual = self.attention_norm(hidden, residual)
        hidden = self.attention(hidden, cos, sin, meta, rows)
        if rows is not None:
            residual = residual[rows]
        if self.attention_out_norm is not None:
            hidden = self.attention_out_norm(hidden, None)[0]
        hidden, residual = self.mlp_norm(hidden, residual)
        hidden = self.mlp(hidden)
        if self.mlp_out_norm is not None:
            hidden = self.mlp_out_norm(hidden, None)[0]
        return hidden, residual


class DecoderBackbone(Backbone):
    """Token embeddings (scaled, for Gemma3) and pre-norm layers; the final RMSNorm is what it finishes
    with."""

    checkpoint_prefixes = ("model.",)
    # the MLP's projections only: FP8 in attention's cost most of the accuracy (Qwen3-0.6B's shape, FP8
    # emulated against float32: QKV alone to a min cosine of 0.993, the output projection 0.995, gate/up
    # 0.998, down 0.999; all four 0.988, the MLP's two 0.997), and the MLP holds most of the GEMM work
    fp8_linears = ("gate_up", "down")
    fp8_fed = ("qkv", "gate_up", "down")
    pretraining_heads = ("lm_head.",)
    token_embeddings = "embed_tokens.weight"

    def __init__(self, config: DecoderConfig, attention_backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, index, attention_backend) for index in range(config.num_layers)
        )
        self.norm = AddRMSNorm(config.hidden_size, config.rms_norm_eps, config.variant.norm_offset)

    def fuse_fp8_inputs(self) -> None:
        # each pre-norm writes its FP8 projection's input (QKV's, gate and up's), the gated product the down
        # projection's
        for layer in self.layers:
            layer.attention_norm.quantize_from = fp8_rows_from(layer.attention.qkv)
            layer.mlp_norm.quantize_from = fp8_rows_from(layer.mlp.gate_up)
            layer.mlp.quantize_from = fp8_rows_from(layer.mlp.down)

    @classmethod
    def parse(cls, hf_config: Any, architecture: str, variant: DecoderVariant, causal: bool) -> DecoderConfig:
        return DecoderConfig.from_hf(hf_config, variant, causal)

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> DecoderBackbone:
        return cls(spec.config, attention_backend)

    @classmethod
    def check_dtype(cls, spec: ModelSpec, dtype: torch.dtype) -> None:
        if dtype == torch.float16 and not spec.config.variant.float16:
            raise UnsupportedModel(
                f"{spec.hf_config.model_type} does not run in float16: its activations overflow float16's "
                "range (transformers runs it in bfloat16 or float32); use --dtype bfloat16 or float32"
            )

    @classmethod
    def config_bidirectional(cls, hf_config: Any, variant: DecoderVariant) -> bool:
        return variant.bidirectional is not None and bool(getattr(hf_config, variant.bidirectional, False))

    @classmethod
    def attention_shape(cls, spec: ModelSpec) -> AttentionShape:
        """With the sliding layers' window, for choosing an attention backend that has one."""
        config = spec.config
        return AttentionShape(config.num_heads, config.num_kv_heads, config.head_dim, config.window)

    @classmethod
    def window(cls, hf_config: Any, config: DecoderConfig) -> int:
        """The position table's length; with a sliding window (Mistral), at most the window, which a
        causal query then never reaches past."""
        window = hf_config.max_position_embeddings
        if config.variant.sliding_window and getattr(hf_config, "sliding_window", None):
            window = min(window, hf_config.sliding_window)
        return window

    def classifier_layout(self) -> ClassifierLayout:
        """*ForSequenceClassification: the last token that is not the pad token (as transformers picks
        it), finished, through `score` (no bias)."""
        return ClassifierLayout(
            out="score", out_bias=False, pooling="last", skip_token=self.config.pad_token_id
        )

    def encode(
        self, batch: PackedBatch, meta: AttentionMetadata, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden], before the final norm (the residual
        # stream); with `rows`, those rows (Backbone.encode)
        return self.run_embedded(self.embed(batch.input_ids), batch.positions, meta, rows)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[num_tokens] ids -> [num_tokens, hidden] token embeddings (scaled, for Gemma)."""
        hidden = self.embed_tokens(input_ids)
        if self.config.variant.embed_scale:
            hidden = hidden * embedding_scale(self.hidden_size, hidden.dtype)
        return hidden

    def run_embedded(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The layers over [num_tokens, hidden] embeddings at [num_tokens] rotary positions -> the residual
        stream (encode's)."""
        # one cos/sin table per layer type, shared by its layers
        rotary = {
            kind: rotary_tables(positions, self.config.head_dim, theta, hidden.dtype)
            for kind, theta in self.config.rope_thetas.items()
        }
        return self.run_layers(hidden, rotary, meta, rows)

    def run_layers(
        self,
        hidden: torch.Tensor,
        rotary: dict[str, tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
        added: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
    ) -> torch.Tensor:
        # token embeddings [num_tokens, hidden] and each layer type's cos, sin -> the residual stream;
        # `added[i]`: (rows, values) added to the stream at those rows after layer i (Qwen3-VL's DeepStack)
        residual = None
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            hidden, residual = layer(
                hidden, residual, *rotary[layer.layer_type], meta, rows if index == last else None
            )
            if index < len(added):
                hidden = hidden.index_add(0, *added[index])
        return hidden + residual

    def finish(self, rows: torch.Tensor) -> torch.Tensor:
        # row-wise, so pooling one row per sequence first gives the same rows
        return rms_norm(rows, self.norm.weight, self.norm.eps, self.norm.offset)

    def weight_map(self) -> WeightTargets:
        config = self.config
        q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        modules = {"embed_tokens": "embed_tokens", "norm": "norm"}
        targets: WeightTargets = {}
        layer_names = SANDWICH_LAYER_NAMES if config.variant.sandwich_norms else LAYER_NAMES
        for index in range(config.num_layers):
            source, target = f"layers.{index}.", f"layers.{index}."
            modules.update({source + name: target + module for name, module in layer_names.items()})
            if config.variant.qk_norm:
                modules.update({source + name: target + module for name, module in QK_NORM_NAMES.items()})
            qkv = {f"{source}self_attn.q_proj": q_rows, f"{source}self_attn.k_proj": kv_rows}
            qkv[f"{source}self_attn.v_proj"] = kv_rows
            targets.update(self.fused_targets(f"{target}attention.qkv", qkv))
            gate_up = {f"{source}mlp.{name}": config.intermediate_size for name in ("gate_proj", "up_proj")}
            targets.update(self.fused_targets(f"{target}mlp.gate_up", gate_up))
        return {**self.module_targets(modules), **targets}


def embedding_scale(hidden_size: int, dtype: torch.dtype) -> float:
    """sqrt(hidden_size) rounded to the model dtype, as transformers' Gemma3 multiplies by it (27.75, not
    27.71, for EmbeddingGemma's 768 in bfloat16); a host number, so a CUDA graph needs no buffer."""
    return float(torch.tensor(hidden_size**0.5).to(dtype))


# checkpoint module (under "layers.N.") -> ours
LAYER_NAMES = {
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "mlp_norm",
    "self_attn.o_proj": "attention.out",
    "mlp.down_proj": "mlp.down",
}
# Gemma3's four norms: its post_attention_layernorm normalizes the attention's output
SANDWICH_LAYER_NAMES = {
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "attention_out_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "mlp_out_norm",
    "self_attn.o_proj": "attention.out",
    "mlp.down_proj": "mlp.down",
}
QK_NORM_NAMES = {
    "self_attn.q_norm": "attention.qk_norm_rotary.q_norm",
    "self_attn.k_norm": "attention.qk_norm_rotary.k_norm",
}
