"""TokenEmbedder: a ColBERT model's head, a unit vector for every token (late interaction scores a query
against a document by the sum over its token vectors of the best match among the document's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.models.backbone import Backbone
from engine.models.dense import Dense, DenseLayout
from engine.models.heads import Head, dense_targets

if TYPE_CHECKING:
    from engine.loader import WeightTargets


class TokenEmbedder(Head):
    """Every token's final hidden state through the projection (PyLate's Dense modules, or colbert-ai's
    `linear`), L2-normalized, float32: a row a token. Which rows a caller keeps (a document's
    punctuation is dropped) is the caller's; `query_only_token` is the token whose trailing run in a
    sequence attends without being a key (a query's expansion, engine/batch.pack)."""

    token_rows = True

    def __init__(
        self,
        backbone: Backbone,
        dense: Sequence[DenseLayout],
        query_only_token: int | None = None,
        linear_name: str | None = None,
    ):
        super().__init__(backbone)
        self.dense = nn.ModuleList(Dense(layout) for layout in dense)
        self.query_only_token = query_only_token
        self.linear_name = linear_name
        self.ignored_weights = (*backbone.ignored_weights, *backbone.pretraining_heads)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, dim] float32 unit rows
        if meta is None:
            meta = AttentionMetadata.build(
                batch.cu_seqlens, batch.max_seqlen, batch.prefix_of, batch.num_query_only
            )
        rows = self.backbone.finish(self.backbone.encode(batch, meta))
        for layer in self.dense:
            rows = layer(rows)
        return F.normalize(rows.float(), p=2.0, dim=-1)

    def weight_map(self) -> WeightTargets:
        return {**super().weight_map(), **dense_targets(self.dense, self.linear_name)}
