"""The heads, written once over any Backbone: Embedder (pooled, normalized vectors), Classifier
(sequence-classification logits) and Judge (a causal LM's yes/no logits). Each is the module the engine
runs: `forward(batch, meta)` gives float32 rows, one a sequence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.layers.activations import get_activation
from engine.layers.pooling import POOLING_METHODS, ROW_POOLINGS, Pooler, last_kept_rows
from engine.models.backbone import Backbone, ClassifierLayout
from engine.models.dense import CHECKPOINT_PREFIX as DENSE_PREFIX
from engine.models.dense import Dense, DenseLayout
from engine.models.head_spec import HeadSpec
from engine.outputs import CLASSIFY, EMBED, RERANK, SEQUENCE, HeadOutput

if TYPE_CHECKING:
    from engine.checkpoint.cross_encoder import LogitScore
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets

JUDGE_TOKENS = ("no", "yes")  # the judge's two logits, in the order softmax's positive class expects


class Head(nn.Module):
    """What the heads share: the backbone, its checkpoint prefixes, and names mapped under it."""

    def __init__(self, backbone: Backbone):
        super().__init__()
        self.backbone = backbone
        self.checkpoint_prefixes = backbone.checkpoint_prefixes
        self.renamed_prefixes = backbone.renamed_prefixes
        self.ignored_weights: tuple[str, ...] = backbone.ignored_weights

    def weight_map(self) -> WeightTargets:
        return {
            name: [_under("backbone.", one) for one in target]
            if isinstance(target, list)
            else _under("backbone.", target)
            for name, target in self.backbone.weight_map().items()
        }

    def pooled(
        self, batch: PackedBatch, meta: AttentionMetadata | None, method: str, skip_id: int | None = None
    ) -> torch.Tensor:
        # PackedBatch -> [num_seqs, hidden] finished rows, pooled by `method` (float32 for mean); "last"
        # with `skip_id` passes over trailing tokens of that id. A method that reads one row a sequence
        # has the backbone compute only those rows past its last attention, and finish only them
        if meta is None:
            meta = AttentionMetadata.build(
                batch.cu_seqlens, batch.max_seqlen, batch.prefix_of, batch.num_query_only
            )
        if method == "last" and skip_id is not None:
            rows = last_kept_rows(meta, batch.input_ids, skip_id)
        elif method in ROW_POOLINGS:
            rows = ROW_POOLINGS[method](meta, batch.num_tokens)
        else:
            return POOLING_METHODS[method](self.backbone.finish(self.backbone.encode(batch, meta)), meta)
        return self.backbone.finish(self.backbone.encode(batch, meta, rows))


class Embedder(Head):
    """Pooled vectors, through the sentence-transformers Dense modules if any, normalized where the model
    is, float32."""

    def __init__(self, backbone: Backbone, pooler: Pooler, dense: Sequence[DenseLayout] = ()):
        super().__init__(backbone)
        self.pooler = pooler
        self.dense = nn.ModuleList(Dense(layout) for layout in dense)
        self.ignored_weights = (*backbone.ignored_weights, *backbone.pretraining_heads)
        width = dense[-1].out_features if dense else backbone.hidden_size
        # late chunking: a sequence's spans mean-pooled apart (PackedBatch.pool_cu_seqlens)
        self.output = HeadOutput(SEQUENCE, width, (EMBED, RERANK), pools_spans=pooler.method == "mean")

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, output size] float32 (pooled spans: a row each)
        if batch.pool_cu_seqlens is not None:
            rows = self.span_means(batch, meta)
        else:
            rows = self.pooled(batch, meta, self.pooler.method)
        if len(self.dense):
            rows = rows.to(self.dense[0].linear.weight.dtype)  # a mean is float32
            for layer in self.dense:
                rows = layer(rows)
        return self.pooler.finish(rows)

    def span_means(self, batch: PackedBatch, meta: AttentionMetadata | None) -> torch.Tensor:
        # PackedBatch -> [num_spans, hidden] float32: every token through the model, each span's mean
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        hidden = self.backbone.finish(self.backbone.encode(batch, meta))
        starts = batch.pool_cu_seqlens
        spans = AttentionMetadata.build(starts, int(torch.diff(starts).max())).to(hidden.device)
        return POOLING_METHODS["mean"](hidden, spans)

    def weight_map(self) -> WeightTargets:
        return {**super().weight_map(), **dense_targets(self.dense)}


def dense_targets(dense: nn.ModuleList, linear_name: str | None = None) -> WeightTargets:
    """The sentence-transformers Dense modules' tensors (HeadSpec.extra_tensors names them) -> the head's
    `dense` list; `linear_name`: the checkpoint's own name of a lone projection (colbert-ai's `linear`,
    ColQwen2's `embedding_proj_layer`)."""
    targets: WeightTargets = {}
    for index, layer in enumerate(dense):
        for name, _ in layer.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            source = f"{linear_name}.{leaf}" if linear_name is not None else f"{DENSE_PREFIX}.{index}.{name}"
            targets[source] = (f"dense.{index}.{name}", None)
    return targets


class Classifier(Head):
    """*ForSequenceClassification (cross-encoders): logits, float32."""

    def __init__(self, backbone: Backbone, layout: ClassifierLayout, num_labels: int):
        super().__init__(backbone)
        self.layout = layout
        hidden_size = backbone.hidden_size
        self.ignored_weights = (*backbone.ignored_weights, *layout.ignored)
        self.dense = nn.Linear(hidden_size, hidden_size, bias=layout.dense_bias) if layout.dense else None
        self.act = get_activation(layout.activation) if layout.dense else None
        self.norm = (
            nn.LayerNorm(hidden_size, eps=layout.norm_eps, bias=layout.norm_bias) if layout.norm else None
        )
        self.out = nn.Linear(hidden_size, num_labels, bias=layout.out_bias)
        self.output = HeadOutput(SEQUENCE, num_labels, classifier_tasks(num_labels))

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, num_labels] float32
        return self.labels(self.pooled(batch, meta, self.layout.pooling, self.layout.skip_token))

    def labels(self, hidden: torch.Tensor) -> torch.Tensor:
        # [rows, hidden] finished rows -> [rows, num_labels] float32: the layout's layers after pooling
        hidden = hidden.to(self.out.weight.dtype)  # a mean is float32
        if self.dense is not None:
            hidden = self.act(self.dense(hidden))
        if self.norm is not None:
            hidden = self.norm(hidden)
        return self.out(hidden).float() + self.layout.logit_offset

    def weight_map(self) -> WeightTargets:
        layout, targets = self.layout, super().weight_map()
        for checkpoint_name, module in ((layout.dense, "dense"), (layout.norm, "norm"), (layout.out, "out")):
            if checkpoint_name is not None:
                for leaf, _ in self.get_submodule(module).named_parameters(recurse=False):
                    targets[f"{checkpoint_name}.{leaf}"] = (f"{module}.{leaf}", None)
        return targets


class Judge(Head):
    """A causal LM as a reranker: the logits of its judge tokens ("no", "yes") at each sequence's last
    token, from those rows of the LM head only (never the vocabulary-wide projection); `log_odds`: one
    score a sequence, the second token's logit less the first's (sentence-transformers' LogitScore)."""

    def __init__(
        self, backbone: Backbone, judge_token_ids: tuple[int, ...], tied: bool, log_odds: bool = False
    ):
        super().__init__(backbone)
        self.judge_token_ids = judge_token_ids
        self.tied = tied
        self.log_odds = log_odds
        self.judge = nn.Linear(backbone.hidden_size, len(judge_token_ids), bias=False)
        self.output = HeadOutput(SEQUENCE, 1 if log_odds else len(judge_token_ids), (RERANK,))
        # a tied head is the embedding table: a copy of it that a checkpoint may still carry is not read
        self.ignored_weights = (*backbone.ignored_weights, "lm_head.") if tied else backbone.ignored_weights

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, len(judge_token_ids)] (log_odds: 1) float32
        logits = self.judge(self.pooled(batch, meta, "last")).float()
        return logits[:, 1:] - logits[:, :1] if self.log_odds else logits

    def weight_map(self) -> WeightTargets:
        targets = super().weight_map()
        judge_rows = ("judge.weight", None, self.judge_token_ids)
        if self.tied:
            embeddings = self.backbone.token_embeddings
            targets[embeddings] = [targets[embeddings], judge_rows]  # type: ignore[list-item]
        else:
            targets["lm_head.weight"] = judge_rows
        return targets


def classifier_tasks(num_labels: int) -> tuple[str, ...]:
    """A sequence classifier's: its labels, and relevance where one or two logits give it."""
    return (RERANK, CLASSIFY) if num_labels in (1, 2) else (CLASSIFY,)


def _under(prefix: str, target: tuple) -> tuple:
    return (prefix + target[0], *target[1:])


def judge_token_ids(spec: ModelSpec) -> tuple[int, int]:
    """The ids of JUDGE_TOKENS, each one token of the model's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    ids = tuple(tokenizer.token_to_id(token) for token in JUDGE_TOKENS)
    if None in ids:
        raise UnsupportedModel(f"model {spec.name!r}: its tokenizer has no single tokens {JUDGE_TOKENS}")
    return ids  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class EmbedderSpec(HeadSpec):
    """An embedding model's: pooled, through its Dense modules, normalized where it is."""

    normalize: bool = True

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        return Embedder(backbone, Pooler(self.pooling, self.normalize), self.dense)


@dataclass(frozen=True, slots=True)
class ClassifierSpec(HeadSpec):
    """A *ForSequenceClassification's (cross-encoders): its logits, from its first token."""

    task: str = "score"
    pooling: str = "cls"
    layout: ClassifierLayout | None = None  # the checkpoint's own, where it is not its family's

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        layout = self.layout or backbone.classifier_layout()
        return Classifier(backbone, layout, self.num_labels or 1)


@dataclass(frozen=True, slots=True)
class JudgeSpec(HeadSpec):
    """A causal LM's judgment at its last token: the logits of "no" and "yes", or a sentence-transformers
    LogitScore's tokens."""

    task: str = "score"
    pooling: str = "last"
    logit_score: LogitScore | None = None
    tied: bool = False  # its LM head is the embedding table (its config says so; untied by default)

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        if self.logit_score is not None:
            token_ids = self.logit_score.token_ids
            return Judge(backbone, token_ids, self.tied, log_odds=len(token_ids) == 2)
        return Judge(backbone, judge_token_ids(spec), self.tied)
