"""Packed BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, MPNet): a Backbone,
each variant a record of switches and names."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, varlen_attention
from engine.attention.position_bias import PositionBias
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.layers.add_norm import AddLayerNorm
from engine.layers.embed_norm import embed_layer_norm
from engine.layers.fp8 import Fp8Linear, fp8_rows_from
from engine.layers.linear_act import LinearActivation
from engine.models.backbone import AttentionShape, Backbone, ClassifierLayout, MlmLayout

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets


# checkpoint module (under a layer) -> ours
BERT_LAYER_NAMES = {
    "attention.output.dense": "attention_out",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "up",
    "output.dense": "down",
    "output.LayerNorm": "mlp_norm",
}
MPNET_LAYER_NAMES = {
    "attention.attn.o": "attention_out",
    "attention.LayerNorm": "attention_norm",
    "intermediate.dense": "up",
    "output.dense": "down",
    "output.LayerNorm": "mlp_norm",
}
DISTILBERT_LAYER_NAMES = {
    "attention.out_lin": "attention_out",
    "sa_layer_norm": "attention_norm",
    "ffn.lin1": "up",
    "ffn.lin2": "down",
    "output_layer_norm": "mlp_norm",
}


@dataclass(frozen=True, slots=True)
class BertVariant:
    """What sets a BERT-family checkpoint apart: its embeddings, its names and its heads."""

    # positions start after the padding index (RoBERTa): the table's first pad_token_id + 1 rows are unused
    positions_after_padding: bool
    # "each": a token reads its type's row; "first": every token reads row 0; "none": there is no table
    token_types: str
    classifier: ClassifierLayout
    pretraining_heads: tuple[str, ...]  # what an embedder does not read
    mlm: MlmLayout  # the masked-LM head (SPLADE reads its logits)
    layers: str = "encoder.layer"  # the checkpoint's list of layers
    layer_names: dict[str, str] = field(default_factory=lambda: BERT_LAYER_NAMES)
    qkv: tuple[str, ...] = ("attention.self.query", "attention.self.key", "attention.self.value")
    # config attributes where this variant's config names them otherwise (the rest are BERT's)
    config_names: dict[str, str] = field(default_factory=dict)
    layer_norm_eps: float | None = None  # fixed by the variant; None: the config's
    padding_index: int | None = None  # fixed by the variant (MPNet's is 1 whatever the config says)
    # MPNet: every layer adds a bias by relative position, its 32 buckets' table in "encoder."
    relative_position_bias: bool = False


# BERT's pooler and `cls.*`, RoBERTa's `lm_head.*`
BERT_PRETRAINING_HEADS = ("pooler.", "cls.", "lm_head.")
BERT_MLM = MlmLayout(
    "cls.predictions.transform.dense",
    "cls.predictions.transform.LayerNorm",
    "cls.predictions.decoder",
    "cls.predictions.bias",
    bias_aliases=("cls.predictions.decoder.bias",),
)
ROBERTA_MLM = MlmLayout(
    "lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias", "gelu",
    bias_aliases=("lm_head.decoder.bias",),
)  # fmt: skip
BERT = BertVariant(
    False, "each", ClassifierLayout(out="classifier", dense="pooler.dense"), BERT_PRETRAINING_HEADS, BERT_MLM
)
# RoBERTa's classifier never reads the pooler that some checkpoints still carry
ROBERTA = BertVariant(
    True,
    "first",
    ClassifierLayout(out="classifier.out_proj", dense="classifier.dense", ignored=("pooler.",)),
    BERT_PRETRAINING_HEADS,
    ROBERTA_MLM,
)
DISTILBERT = BertVariant(
    False,
    "none",
    ClassifierLayout(out="classifier", dense="pre_classifier", activation="relu"),
    ("vocab_transform.", "vocab_layer_norm.", "vocab_projector."),
    MlmLayout(
        "vocab_transform", "vocab_layer_norm", "vocab_projector", "vocab_projector.bias", norm_eps=1e-12
    ),
    layers="transformer.layer",
    layer_names=DISTILBERT_LAYER_NAMES,
    qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
    config_names={"intermediate_size": "hidden_dim", "hidden_act": "activation"},
    layer_norm_eps=1e-12,
)
MPNET = BertVariant(
    True,
    "none",
    ROBERTA.classifier,
    ("pooler.", "lm_head."),
    ROBERTA_MLM,
    layer_names=MPNET_LAYER_NAMES,
    qkv=("attention.attn.q", "attention.attn.k", "attention.attn.v"),
    padding_index=1,
    relative_position_bias=True,
)


@dataclass(frozen=True, slots=True)
class BertConfig:
    variant: BertVariant
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int  # 0: no table
    position_offset: int
    num_buckets: int  # of the relative position bias; 0: none

    @classmethod
    def from_hf(cls, hf_config: Any, variant: BertVariant) -> BertConfig:
        model_type = hf_config.model_type
        embedding_type = getattr(hf_config, "position_embedding_type", "absolute")
        if embedding_type != "absolute":
            raise UnsupportedModel(f"{model_type}: unsupported position_embedding_type {embedding_type!r}")
        if hf_config.hidden_size % hf_config.num_attention_heads:
            raise UnsupportedModel(f"{model_type}: hidden_size is not a multiple of num_attention_heads")

        def setting(name: str) -> Any:
            return getattr(hf_config, variant.config_names.get(name, name))

        padding_index = hf_config.pad_token_id if variant.padding_index is None else variant.padding_index

        return cls(
            variant=variant,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=hf_config.num_attention_heads,
            intermediate_size=setting("intermediate_size"),
            hidden_act=setting("hidden_act"),
            layer_norm_eps=variant.layer_norm_eps or setting("layer_norm_eps"),
            max_position_embeddings=hf_config.max_position_embeddings,
            type_vocab_size=0 if variant.token_types == "none" else setting("type_vocab_size"),
            position_offset=padding_index + 1 if variant.positions_after_padding else 0,
            num_buckets=setting("relative_attention_num_buckets") if variant.relative_position_bias else 0,
        )


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size else None
        )
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.position_offset = config.position_offset
        self.use_token_types = config.variant.token_types == "each"

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
        elif self.token_type_embeddings is not None:
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

    def forward(
        self,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        bias: PositionBias | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]; with `rows`, [len(rows), hidden] of those rows
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv(hidden).view(num_tokens, 3, self.num_heads, self.head_dim).unbind(1)
        attention = varlen_attention(q, k, v, meta, backend=self.attention_backend, bias=bias)
        attention = attention.reshape(num_tokens, -1)
        if rows is not None:
            attention, hidden = attention[rows], hidden[rows]
        hidden, up_input = self.attention_norm.with_input(self.attention_out(attention), hidden)
        return self.mlp_norm(self.down(self.up(up_input)), hidden)


class BertBackbone(Backbone):
    """Embeddings (+ LayerNorm) and post-norm layers; nothing to finish."""

    checkpoint_prefixes = ("bert.", "roberta.", "distilbert.", "mpnet.")
    fp8_linears = ("qkv", "attention_out", "up", "down")
    # QKV's input stays the MLP's LayerNorm output, quantized in the projection: written by that norm's
    # pass on the H100, XLM-R large at 5 x 512 tokens ran 0.86x bf16 where the projection's own pass ran
    # 1.04x (a fed input is timed as free, its producer's pass is not)
    fp8_fed = ("up", "down")
    fp8_activated = ("up",)
    ignored_weights = ("embeddings.position_ids", "embeddings.token_type_ids")
    token_embeddings = "embeddings.word_embeddings.weight"

    def __init__(self, config: BertConfig, attention_backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.pretraining_heads = config.variant.pretraining_heads
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config, attention_backend) for _ in range(config.num_layers))
        self.relative_attention_bias = (
            nn.Embedding(config.num_buckets, config.num_heads) if config.num_buckets else None
        )

    def fuse_fp8_inputs(self) -> None:
        # the attention's LayerNorm writes the up projection's input; the up projection's GELU, the down's.
        # The QKV input (the last LayerNorm's, also the residual) and the attention output are quantized
        # in their projections
        for layer in self.layers:
            if isinstance(layer.up, Fp8Linear) and isinstance(layer.down, Fp8Linear):
                # a pair, as measured (fp8_activated): the GELU writes the down projection's input
                layer.up.min_rows = layer.down.min_rows = max(layer.up.min_rows, layer.down.min_rows)
            layer.attention_norm.quantize_from = fp8_rows_from(layer.up)
            if isinstance(layer.up, Fp8Linear):
                layer.up.quantize_output_from = fp8_rows_from(layer.down)

    @classmethod
    def parse(cls, hf_config: Any, architecture: str, variant: BertVariant, causal: bool) -> BertConfig:
        return BertConfig.from_hf(hf_config, variant)

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> BertBackbone:
        return cls(spec.config, attention_backend)

    @classmethod
    def attention_shape(cls, spec: ModelSpec) -> AttentionShape:
        config = spec.config
        head_dim = config.hidden_size // config.num_heads
        bias = config.num_buckets > 0
        return AttentionShape(config.num_heads, config.num_heads, head_dim, position_bias=bias)

    @classmethod
    def window(cls, hf_config: Any, config: BertConfig) -> int:
        """The longest sequence the position table holds, past the rows before the first position."""
        return config.max_position_embeddings - config.position_offset

    def classifier_layout(self) -> ClassifierLayout:
        return self.config.variant.classifier

    def mlm_layout(self) -> MlmLayout:
        return self.config.variant.mlm

    def encode(
        self, batch: PackedBatch, meta: AttentionMetadata, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden] (with `rows`, those rows: Backbone.encode)
        hidden = self.embeddings(batch.input_ids, batch.positions, batch.token_type_ids)
        bias = self.position_bias()
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, meta, bias, rows if index == last else None)
        return hidden

    def position_bias(self) -> PositionBias | None:
        """MPNet's bias of each head by the key's offset from its query, computed once a batch as
        transformers computes it once a forward, for every layer."""
        if self.relative_attention_bias is None:
            return None
        table = self.relative_attention_bias.weight
        offsets = torch.arange(-MAX_DISTANCE, MAX_DISTANCE + 1, device=table.device)
        by_offset = self.relative_attention_bias(relative_position_buckets(offsets)).T.float().contiguous()
        return PositionBias(by_offset, MAX_DISTANCE)

    def weight_map(self) -> WeightTargets:
        variant = self.config.variant
        modules = {f"embeddings.{table}": f"embeddings.{table}" for table in EMBEDDING_TABLES}
        if self.embeddings.token_type_embeddings is None:
            del modules["embeddings.token_type_embeddings"]
        modules["embeddings.LayerNorm"] = "embeddings.norm"
        if self.relative_attention_bias is not None:
            modules["encoder.relative_attention_bias"] = "relative_attention_bias"
        targets: WeightTargets = {}
        for index in range(self.config.num_layers):
            source, target = f"{variant.layers}.{index}.", f"layers.{index}."
            modules.update({source + name: target + module for name, module in variant.layer_names.items()})
            projections = {source + name: self.config.hidden_size for name in variant.qkv}
            targets.update(self.fused_targets(f"{target}qkv", projections))
        return {**self.module_targets(modules), **targets}


EMBEDDING_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")
# MPNet's buckets: transformers computes them with these values whatever the config's table size, and
# every offset past MAX_DISTANCE falls in the last bucket of its side
NUM_BUCKETS = 32
MAX_DISTANCE = 128


def relative_position_buckets(offsets: torch.Tensor) -> torch.Tensor:
    """T5-style buckets of key-minus-query offsets: half the buckets a side, exact up to a quarter of them,
    then logarithmic up to MAX_DISTANCE (the float32 arithmetic transformers' MPNet uses)."""
    half = NUM_BUCKETS // 2
    exact = half // 2
    distance = offsets.abs()
    logarithmic = exact + (
        torch.log(distance.float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)
    ).to(torch.long)
    logarithmic = logarithmic.clamp(max=half - 1)
    # transformers' side flag is of the query-minus-key offset: keys after their query take the upper half
    return (offsets > 0).long() * half + torch.where(distance < exact, distance, logarithmic)
