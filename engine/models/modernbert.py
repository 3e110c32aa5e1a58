"""Packed ModernBERT: a Backbone (ModernBertModel, and *ForMaskedLM run as the bare encoder; its
classifier's layout for ModernBertForSequenceClassification)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, varlen_attention
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.layers.activations import get_activation
from engine.layers.rotary import apply_rotary, rope_theta, rotary_tables
from engine.models.backbone import AttentionShape, Backbone, ClassifierLayout

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets

LAYER_TYPES = ("full_attention", "sliding_attention")
CLASSIFIER_POOLINGS = ("cls", "mean")
# checkpoint module (under "layers.N.") -> ours; biases and norm biases follow the config's flags
LAYER_NAMES = {
    "attn_norm": "attention_norm",
    "attn.Wqkv": "qkv",
    "attn.Wo": "attention_out",
    "mlp_norm": "mlp_norm",
    "mlp.Wi": "up",
    "mlp.Wo": "down",
}


@dataclass(frozen=True, slots=True)
class ModernBertConfig:
    vocab_size: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    hidden_activation: str
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    layer_types: tuple[str, ...]  # one per layer: "full_attention" or "sliding_attention"
    rope_thetas: dict[str, float]  # layer type -> rotary base
    half_window: int  # a sliding layer's query sees keys at most this many tokens away, on each side
    classifier_pooling: str
    classifier_bias: bool
    classifier_activation: str

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @classmethod
    def from_hf(cls, hf_config: Any, architecture: str) -> ModernBertConfig:
        if hf_config.hidden_size % hf_config.num_attention_heads:
            raise UnsupportedModel(f"{architecture}: hidden_size is not a multiple of num_attention_heads")
        layer_types = getattr(hf_config, "layer_types", None)
        if layer_types is None:  # configs before transformers 5 give only the period of global layers
            every = getattr(hf_config, "global_attn_every_n_layers", 3)
            layer_types = [
                "sliding_attention" if index % every else "full_attention"
                for index in range(hf_config.num_hidden_layers)
            ]
        unknown = set(layer_types) - set(LAYER_TYPES)
        if unknown or len(layer_types) != hf_config.num_hidden_layers:
            raise UnsupportedModel(f"{architecture}: unsupported layer_types {layer_types}")
        pooling = getattr(hf_config, "classifier_pooling", "cls")
        if pooling not in CLASSIFIER_POOLINGS:
            raise UnsupportedModel(f"{architecture}: unsupported classifier_pooling {pooling!r}")
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_heads=hf_config.num_attention_heads,
            intermediate_size=hf_config.intermediate_size,
            hidden_activation=hf_config.hidden_activation,
            norm_eps=hf_config.norm_eps,
            norm_bias=hf_config.norm_bias,
            attention_bias=hf_config.attention_bias,
            mlp_bias=hf_config.mlp_bias,
            layer_types=tuple(layer_types),
            rope_thetas={kind: rope_theta(hf_config, kind) for kind in dict.fromkeys(layer_types)},
            # HF masks |query - key| <= local_attention // 2 (its flash path: window_size (w, w), the
            # "sliding_window + 1" it stores minus one), so 2 * (local_attention // 2) + 1 keys at most
            half_window=hf_config.local_attention // 2,
            classifier_pooling=pooling,
            classifier_bias=getattr(hf_config, "classifier_bias", False),
            classifier_activation=getattr(hf_config, "classifier_activation", "gelu"),
        )

    def layer_norm(self) -> nn.LayerNorm:
        return nn.LayerNorm(self.hidden_size, eps=self.norm_eps, bias=self.norm_bias)


class ModernBertLayer(nn.Module):
    """Pre-norm block: rotary self-attention over the whole sequence or a sliding window, then a gated
    MLP (act(input) * gate), each added to the residual stream."""

    def __init__(self, config: ModernBertConfig, index: int, attention_backend: AttentionBackend):
        super().__init__()
        hidden_size = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = hidden_size // config.num_heads
        self.attention_backend = attention_backend
        self.layer_type = config.layer_types[index]
        self.window = (config.half_window,) * 2 if self.layer_type == "sliding_attention" else None
        # the embeddings' norm already normalizes the first layer's input
        self.attention_norm = nn.Identity() if index == 0 else config.layer_norm()
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=config.attention_bias)
        self.attention_out = nn.Linear(hidden_size, hidden_size, bias=config.attention_bias)
        self.mlp_norm = config.layer_norm()
        self.up = nn.Linear(hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = get_activation(config.hidden_activation)
        self.down = nn.Linear(config.intermediate_size, hidden_size, bias=config.mlp_bias)

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]; with `rows`, [len(rows), hidden] of those rows
        num_tokens = hidden.shape[0]
        qkv = self.qkv(self.attention_norm(hidden)).view(num_tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(1)
        cos, sin = rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        attention = varlen_attention(q, k, v, meta, backend=self.attention_backend, window=self.window)
        attention = attention.reshape(num_tokens, -1)
        if rows is not None:
            attention, hidden = attention[rows], hidden[rows]
        hidden = hidden + self.attention_out(attention)
        up, gate = self.up(self.mlp_norm(hidden)).chunk(2, dim=-1)
        return hidden + self.down(self.act(up) * gate)


class ModernBertBackbone(Backbone):
    """Embeddings (+ LayerNorm) and pre-norm layers; the final norm is what it finishes with."""

    checkpoint_prefixes = ("model.",)
    fp8_linears = ("qkv", "attention_out", "up", "down")
    pretraining_heads = ("head.", "decoder.")  # the masked-LM head
    token_embeddings = "embeddings.tok_embeddings.weight"

    def __init__(self, config: ModernBertConfig, attention_backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.head_dim = config.hidden_size // config.num_heads
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embedding_norm = config.layer_norm()
        self.layers = nn.ModuleList(
            ModernBertLayer(config, index, attention_backend) for index in range(config.num_layers)
        )
        self.final_norm = config.layer_norm()

    @classmethod
    def parse(cls, hf_config: Any, architecture: str, variant: None, causal: bool) -> ModernBertConfig:
        return ModernBertConfig.from_hf(hf_config, architecture)

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> ModernBertBackbone:
        return cls(spec.config, attention_backend)

    @classmethod
    def attention_shape(cls, spec: ModelSpec) -> AttentionShape:
        """With the sliding layers' window, for choosing an attention backend that has one."""
        config = spec.config
        head_dim = config.hidden_size // config.num_heads
        has_sliding = "sliding_attention" in config.layer_types
        window = (config.half_window, config.half_window) if has_sliding else None
        return AttentionShape(config.num_heads, config.num_heads, head_dim, window)

    def classifier_layout(self) -> ClassifierLayout:
        """Dense, activation and LayerNorm; pooled from the first token or the mean of the tokens, as the
        config's classifier_pooling says."""
        config = self.config
        return ClassifierLayout(
            out="classifier",
            dense="head.dense",
            activation=config.classifier_activation,
            dense_bias=config.classifier_bias,
            norm="head.norm",
            norm_eps=config.norm_eps,
            norm_bias=config.norm_bias,
            pooling=config.classifier_pooling,
        )

    def encode(
        self, batch: PackedBatch, meta: AttentionMetadata, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden], before the final norm (with `rows`, those
        # rows: Backbone.encode)
        hidden = self.embedding_norm(self.embeddings(batch.input_ids))
        # one cos/sin table per layer type, shared by its layers; computed here, not kept in buffers,
        # since load_weights fills only parameters
        rotary = {
            kind: rotary_tables(batch.positions, self.head_dim, theta, hidden.dtype)
            for kind, theta in self.config.rope_thetas.items()
        }
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, rotary[layer.layer_type], meta, rows if index == last else None)
        return hidden

    def finish(self, rows: torch.Tensor) -> torch.Tensor:
        return self.final_norm(rows)

    def weight_map(self) -> WeightTargets:
        """Every checkpoint tensor the model needs -> where it goes; a module without a bias (per the
        config) takes none, and the first layer has no attention norm."""
        modules = {"embeddings.tok_embeddings": "embeddings", "embeddings.norm": "embedding_norm"}
        for index in range(self.config.num_layers):
            for checkpoint_name, module in LAYER_NAMES.items():
                modules[f"layers.{index}.{checkpoint_name}"] = f"layers.{index}.{module}"
        modules["final_norm"] = "final_norm"
        return self.module_targets(modules)
