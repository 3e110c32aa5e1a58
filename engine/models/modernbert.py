"""Packed ModernBERT encoders: pooled embeddings (ModernBertModel, and *ForMaskedLM run as the bare
encoder) or sequence-classification logits (ModernBertForSequenceClassification)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, varlen_attention
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.layers.activations import get_activation
from engine.layers.pooling import Pooler, cls_pool, mean_pool
from engine.layers.rotary import apply_rotary, rope_theta, rotary_tables

if TYPE_CHECKING:
    from engine.loader import ModelSpec, WeightTargets

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
    num_labels: int

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
            num_labels=hf_config.num_labels,
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
        self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]
        num_tokens = hidden.shape[0]
        qkv = self.qkv(self.attention_norm(hidden)).view(num_tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(1)
        cos, sin = rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        attention = varlen_attention(q, k, v, meta, backend=self.attention_backend, window=self.window)
        hidden = hidden + self.attention_out(attention.reshape(num_tokens, -1))
        up, gate = self.up(self.mlp_norm(hidden)).chunk(2, dim=-1)
        return hidden + self.down(self.act(up) * gate)


class ModernBertHead(nn.Module):
    """The classification head: dense, activation, LayerNorm, then the classifier."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = get_activation(config.classifier_activation)
        self.norm = config.layer_norm()
        self.out = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        # [num_seqs, hidden] -> [num_seqs, num_labels]
        return self.out(self.norm(self.act(self.dense(pooled))))


class ModernBertEncoder(nn.Module):
    """Embeddings, layers and the final norm; subclasses add the head. The checkpoint name map lives here."""

    checkpoint_prefixes = ("model.",)
    # checkpoint names (after the prefix) skipped on purpose; a trailing "." skips everything under it
    ignored_weights: tuple[str, ...] = ()

    def __init__(self, config: ModernBertConfig, attention_backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.head_dim = config.hidden_size // config.num_heads
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embedding_norm = config.layer_norm()
        self.layers = nn.ModuleList(
            ModernBertLayer(config, index, attention_backend) for index in range(config.num_layers)
        )
        self.final_norm = config.layer_norm()

    @staticmethod
    def attention_window(spec: ModelSpec) -> tuple[int, int] | None:
        """The sliding layers' window, for choosing an attention backend that has one."""
        config = ModernBertConfig.from_hf(spec.hf_config, spec.architecture)
        has_sliding = "sliding_attention" in config.layer_types
        return (config.half_window, config.half_window) if has_sliding else None

    def encode(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden], final-normed
        hidden = self.embedding_norm(self.embeddings(batch.input_ids))
        # one cos/sin table per layer type, shared by its layers; computed here, not kept in buffers,
        # since the loader fills only parameters
        rotary = {
            kind: rotary_tables(batch.positions, self.head_dim, theta, hidden.dtype)
            for kind, theta in self.config.rope_thetas.items()
        }
        for layer in self.layers:
            hidden = layer(hidden, rotary[layer.layer_type], meta)
        return self.final_norm(hidden)

    def weight_map(self) -> WeightTargets:
        """Every checkpoint tensor the model needs -> where it goes; a module without a bias (per the
        config) takes none, and the first layer has no attention norm."""
        modules = {"embeddings.tok_embeddings": "embeddings", "embeddings.norm": "embedding_norm"}
        for index in range(self.config.num_layers):
            for checkpoint_name, module in LAYER_NAMES.items():
                modules[f"layers.{index}.{checkpoint_name}"] = f"layers.{index}.{module}"
        modules["final_norm"] = "final_norm"
        return self.targets(modules)

    def targets(self, modules: dict[str, str]) -> WeightTargets:
        """checkpoint module -> our module, expanded to one entry per parameter our module has."""
        targets: WeightTargets = {}
        for checkpoint_name, module in modules.items():
            for leaf, _ in self.get_submodule(module).named_parameters(recurse=False):
                targets[f"{checkpoint_name}.{leaf}"] = (f"{module}.{leaf}", None)
        return targets


class ModernBertEmbedder(ModernBertEncoder):
    """ModernBertModel (and *ForMaskedLM as sentence-transformers runs it): pooled, optionally
    normalized, float32 vectors."""

    # the masked-LM head plays no part in embeddings
    ignored_weights = ("head.", "decoder.")

    def __init__(self, config: ModernBertConfig, attention_backend: AttentionBackend, pooler: Pooler):
        super().__init__(config, attention_backend)
        self.pooler = pooler

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> ModernBertEmbedder:
        config = ModernBertConfig.from_hf(spec.hf_config, spec.architecture)
        return cls(config, attention_backend, Pooler(spec.pooling, spec.normalize))

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, hidden] float32
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        return self.pooler(self.encode(batch, meta), meta)


class ModernBertClassifier(ModernBertEncoder):
    """ModernBertForSequenceClassification (cross-encoders): logits from the first token or the mean
    of the tokens, per the config's classifier_pooling, float32."""

    def __init__(self, config: ModernBertConfig, attention_backend: AttentionBackend):
        super().__init__(config, attention_backend)
        self.head = ModernBertHead(config)

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> ModernBertClassifier:
        return cls(ModernBertConfig.from_hf(spec.hf_config, spec.architecture), attention_backend)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, num_labels] float32
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        hidden = self.encode(batch, meta)
        if self.config.classifier_pooling == "mean":
            pooled = mean_pool(hidden, meta).to(hidden.dtype)
        else:
            pooled = cls_pool(hidden, meta)
        return self.head(pooled).float()

    def weight_map(self) -> WeightTargets:
        head = {"head.dense": "head.dense", "head.norm": "head.norm", "classifier": "head.out"}
        return {**super().weight_map(), **self.targets(head)}
