"""Packed BERT, RoBERTa and XLM-RoBERTa encoders: pooled embeddings or sequence-classification logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, varlen_attention
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.layers.add_norm import AddLayerNorm
from engine.layers.embed_norm import embed_layer_norm
from engine.layers.linear_act import LinearActivation
from engine.layers.pooling import Pooler, cls_pool

if TYPE_CHECKING:
    from engine.loader import ModelSpec, WeightTargets

ROBERTA_ARCHITECTURE_PREFIXES = ("Roberta", "XLMRoberta")


@dataclass(frozen=True, slots=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    is_roberta: bool  # positions offset by pad_token_id + 1, only the type-0 embedding, RoBERTa head names
    position_offset: int
    num_labels: int

    @classmethod
    def from_hf(cls, hf_config: Any, architecture: str) -> BertConfig:
        embedding_type = getattr(hf_config, "position_embedding_type", "absolute")
        if embedding_type != "absolute":
            raise UnsupportedModel(f"{architecture}: unsupported position_embedding_type {embedding_type!r}")
        if hf_config.hidden_size % hf_config.num_attention_heads:
            raise UnsupportedModel(f"{architecture}: hidden_size is not a multiple of num_attention_heads")
        is_roberta = architecture.startswith(ROBERTA_ARCHITECTURE_PREFIXES)
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=hf_config.num_attention_heads,
            intermediate_size=hf_config.intermediate_size,
            hidden_act=hf_config.hidden_act,
            layer_norm_eps=hf_config.layer_norm_eps,
            max_position_embeddings=hf_config.max_position_embeddings,
            type_vocab_size=hf_config.type_vocab_size,
            is_roberta=is_roberta,
            position_offset=hf_config.pad_token_id + 1 if is_roberta else 0,
            num_labels=hf_config.num_labels,
        )


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.position_offset = config.position_offset
        self.use_token_types = not config.is_roberta

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        # [num_tokens] ids, positions, types -> [num_tokens, hidden]
        fused = embed_layer_norm(
            input_ids,
            positions,
            token_type_ids if self.use_token_types else None,
            self.word_embeddings,
            self.position_embeddings,
            self.token_type_embeddings,
            self.norm,
            self.position_offset,
        )
        if fused is not None:
            return fused
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions + self.position_offset)
        if self.use_token_types:
            hidden = hidden + self.token_type_embeddings(token_type_ids)
        else:
            hidden = hidden + self.token_type_embeddings.weight[0]
        return self.norm(hidden)


class BertLayer(nn.Module):
    """Post-norm block: fused-QKV self-attention, then an MLP whose activation rides the up projection's
    GEMM, each closed by LayerNorm(x + residual)."""

    def __init__(self, config: BertConfig, attention_backend: AttentionBackend):
        super().__init__()
        hidden_size = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = hidden_size // config.num_heads
        self.attention_backend = attention_backend
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.attention_out = nn.Linear(hidden_size, hidden_size)
        self.attention_norm = AddLayerNorm(hidden_size, eps=config.layer_norm_eps)
        self.up = LinearActivation(hidden_size, config.intermediate_size, config.hidden_act)
        self.down = nn.Linear(config.intermediate_size, hidden_size)
        self.mlp_norm = AddLayerNorm(hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv(hidden).view(num_tokens, 3, self.num_heads, self.head_dim).unbind(1)
        attention = varlen_attention(q, k, v, meta, backend=self.attention_backend)
        hidden = self.attention_norm(self.attention_out(attention.reshape(num_tokens, -1)), hidden)
        return self.mlp_norm(self.down(self.up(hidden)), hidden)


class ClassificationHead(nn.Module):
    """BERT's pooler (dense + tanh) and classifier, or RoBERTa's classifier: the same shape."""

    def __init__(self, hidden_size: int, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, num_labels)

    def forward(self, first_tokens: torch.Tensor) -> torch.Tensor:
        # [num_seqs, hidden] -> [num_seqs, num_labels]
        return self.out(torch.tanh(self.dense(first_tokens)))


class BertEncoder(nn.Module):
    """Embeddings and layers; subclasses add the head. The checkpoint name map lives here."""

    checkpoint_prefixes = ("bert.", "roberta.")
    # checkpoint names (after the prefix) skipped on purpose; a trailing "." skips everything under it
    ignored_weights: tuple[str, ...] = ("embeddings.position_ids", "embeddings.token_type_ids")

    def __init__(self, config: BertConfig, attention_backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config, attention_backend) for _ in range(config.num_layers))

    def encode(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden]
        hidden = self.embeddings(batch.input_ids, batch.positions, batch.token_type_ids)
        for layer in self.layers:
            hidden = layer(hidden, meta)
        return hidden

    def weight_map(self) -> WeightTargets:
        """Every checkpoint tensor the model needs -> where it goes."""
        hidden_size = self.config.hidden_size
        targets: WeightTargets = {}
        for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            targets[f"embeddings.{table}.weight"] = (f"embeddings.{table}.weight", None)
        for leaf in ("weight", "bias"):
            targets[f"embeddings.LayerNorm.{leaf}"] = (f"embeddings.norm.{leaf}", None)
        layer_names = {
            "attention.output.dense": "attention_out",
            "attention.output.LayerNorm": "attention_norm",
            "intermediate.dense": "up",
            "output.dense": "down",
            "output.LayerNorm": "mlp_norm",
        }
        fused = {"query": 0, "key": 1, "value": 2}
        for index in range(self.config.num_layers):
            source, target = f"encoder.layer.{index}.", f"layers.{index}."
            for leaf in ("weight", "bias"):
                for checkpoint_name, module in layer_names.items():
                    targets[f"{source}{checkpoint_name}.{leaf}"] = (f"{target}{module}.{leaf}", None)
                for projection, shard in fused.items():
                    rows = slice(shard * hidden_size, (shard + 1) * hidden_size)
                    targets[f"{source}attention.self.{projection}.{leaf}"] = (f"{target}qkv.{leaf}", rows)
        return targets


class BertEmbedder(BertEncoder):
    """BertModel / RobertaModel / XLMRobertaModel: pooled, optionally normalized, float32 vectors."""

    # pretraining heads (BERT's pooler and `cls.*`, RoBERTa's `lm_head.*`) play no part in embeddings
    ignored_weights = (*BertEncoder.ignored_weights, "pooler.", "cls.", "lm_head.")

    def __init__(self, config: BertConfig, attention_backend: AttentionBackend, pooler: Pooler):
        super().__init__(config, attention_backend)
        self.pooler = pooler

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> BertEmbedder:
        config = BertConfig.from_hf(spec.hf_config, spec.architecture)
        return cls(config, attention_backend, Pooler(spec.pooling, spec.normalize))

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, hidden] float32
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        return self.pooler(self.encode(batch, meta), meta)


class BertClassifier(BertEncoder):
    """*ForSequenceClassification (cross-encoders): logits from the first token, float32."""

    def __init__(self, config: BertConfig, attention_backend: AttentionBackend):
        super().__init__(config, attention_backend)
        self.head = ClassificationHead(config.hidden_size, config.num_labels)
        if config.is_roberta:
            # RoBERTa's classifier never reads the pooler some checkpoints still carry
            self.ignored_weights = (*BertEncoder.ignored_weights, "pooler.")

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> BertClassifier:
        return cls(BertConfig.from_hf(spec.hf_config, spec.architecture), attention_backend)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, num_labels] float32
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        return self.head(cls_pool(self.encode(batch, meta), meta)).float()

    def weight_map(self) -> WeightTargets:
        head = (
            {"classifier.dense": "head.dense", "classifier.out_proj": "head.out"}
            if self.config.is_roberta
            else {"pooler.dense": "head.dense", "classifier": "head.out"}
        )
        targets = super().weight_map()
        for leaf in ("weight", "bias"):
            for checkpoint_name, module in head.items():
                targets[f"{checkpoint_name}.{leaf}"] = (f"{module}.{leaf}", None)
        return targets
