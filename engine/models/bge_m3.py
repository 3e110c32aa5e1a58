"""M3Embedder: bge-m3's three outputs from one forward, a row a token: [vector | weight], where a
sequence's first row holds its dense vector (the normalized [CLS] state) and each later row its token's
normalized ColBERT vector; the weight is the token's lexical weight, relu(sparse_linear(state)).
bge-m3 reads no ColBERT vector of [CLS], so its row carries the dense vector at no extra width."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.checkpoint.splade import M3_FILES
from engine.models.backbone import Backbone
from engine.models.head_spec import HeadSpec
from engine.models.heads import Head
from engine.outputs import EMBED, RERANK, SPARSE_EMBED, TOKEN, TOKEN_EMBED, HeadOutput, TaskRows

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets


class M3Embedder(Head):
    def __init__(self, backbone: Backbone):
        super().__init__(backbone)
        hidden_size = backbone.hidden_size
        vector, weight = (0, hidden_size), (hidden_size, hidden_size + 1)
        # embedding and rerank read each text's dense vector (its first row's vector), token vectors the
        # vectors (a text's first is its dense one), sparse embedding the weights
        dense = TaskRows(first_rows=True, columns=vector)
        task_rows = {
            EMBED: dense,
            RERANK: dense,
            TOKEN_EMBED: TaskRows(columns=vector),
            SPARSE_EMBED: TaskRows(columns=weight),
        }
        self.output = HeadOutput(
            TOKEN, hidden_size + 1, tuple(task_rows), takes_first_rows=True, task_rows=task_rows
        )
        # the ColBERT vectors are as wide as the dense one (bge-m3's are): a first row holds either
        self.colbert_linear = nn.Linear(hidden_size, hidden_size)
        self.sparse_linear = nn.Linear(hidden_size, 1)
        self.ignored_weights = (*backbone.ignored_weights, *backbone.pretraining_heads)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden + 1] float32
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        hidden = self.backbone.finish(self.backbone.encode(batch, meta))
        # a sequence's first token is the one at position 0 (so are a graph's padding rows, never read)
        first = (batch.positions == 0).unsqueeze(1)
        vectors = torch.where(first, hidden, self.colbert_linear(hidden))
        vectors = F.normalize(vectors.float(), p=2.0, dim=-1)
        weights = torch.relu(self.sparse_linear(hidden).float())
        return torch.cat([vectors, weights], dim=-1)

    def weight_map(self) -> WeightTargets:
        targets = super().weight_map()
        for module in ("colbert_linear", "sparse_linear"):
            for leaf in ("weight", "bias"):
                targets[f"{module}.{leaf}"] = (f"{module}.{leaf}", None)
        return targets


@dataclass(frozen=True, slots=True)
class M3Spec(HeadSpec):
    """bge-m3's sentence-transformers folder (its dense vector: the normalized [CLS] state) with its two
    extra heads beside it, colbert_linear.pt and sparse_linear.pt."""

    pooling: str = "cls"
    normalize: bool = True

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        return M3Embedder(backbone)

    def extra_tensors(self, spec: ModelSpec) -> dict[str, torch.Tensor]:
        from engine.weights import load_pickle

        return {
            f"{Path(file).stem}.{key}": value
            for file in M3_FILES
            for key, value in load_pickle(spec.path / file).items()
        }
