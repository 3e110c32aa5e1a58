"""ListwiseRanker: a causal LM that reads a query and many documents in one prompt (jina-reranker-v3's
JinaForRanking) and gives a unit vector at each marker token: one after each document and one after the
query; a document's score is the cosine of its vector and the query's (scoring/listwise.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.checkpoint.listwise import LISTWISE_ARCHITECTURES, ListwiseConfig, read_listwise
from engine.errors import UnsupportedModel
from engine.layers.pooling import ROW_POOLINGS
from engine.models.backbone import Backbone
from engine.models.head_spec import HeadSpec
from engine.models.heads import Head
from engine.outputs import MARKER, RERANK, HeadOutput

if TYPE_CHECKING:
    from engine.checkpoint.folder import Checkpoint
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets


class ListwiseRanker(Head):
    """The final hidden state of each marker token (the batch's row_index, which the engine builds from
    `row_tokens`; without one, each sequence's last token), through the projector (Linear, ReLU, Linear;
    no biases), L2-normalized, float32. Only those rows run past the last attention."""

    def __init__(self, backbone: Backbone, config: ListwiseConfig):
        super().__init__(backbone)
        row_tokens = (config.document_token_id, config.query_token_id)
        self.output = HeadOutput(MARKER, config.projection_dim, (RERANK,), row_tokens=row_tokens)
        hidden_size = backbone.hidden_size
        self.projector = nn.Sequential(
            nn.Linear(hidden_size, hidden_size // 2, bias=False),
            nn.ReLU(),
            nn.Linear(hidden_size // 2, config.projection_dim, bias=False),
        )
        self.ignored_weights = (*backbone.ignored_weights, *backbone.pretraining_heads)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch with row_index of n markers -> [n, projection_dim] float32 unit rows
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        # a batch packed without markers (warm-up, the rate's seed batch): each sequence's last token
        rows = (
            batch.row_index if batch.row_index is not None else ROW_POOLINGS["last"](meta, batch.num_tokens)
        )
        hidden = self.backbone.finish(self.backbone.encode(batch, meta, rows))
        return F.normalize(self.projector(hidden).float(), p=2.0, dim=-1)

    def weight_map(self) -> WeightTargets:
        targets = super().weight_map()
        for index in (0, 2):
            targets[f"projector.{index}.weight"] = (f"projector.{index}.weight", None)
        return targets


@dataclass(frozen=True, slots=True)
class ListwiseSpec(HeadSpec):
    task: str = "score"
    replaces_head: bool = True
    listwise: ListwiseConfig | None = None

    def output_dim(self, hf_config: Any) -> int:
        return self.listwise.projection_dim

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        return ListwiseRanker(backbone, self.listwise)


def detect_listwise(checkpoint: Checkpoint) -> ListwiseSpec | None:
    """A listwise ranker's architecture, on a decoder posy packs."""
    if checkpoint.architecture not in LISTWISE_ARCHITECTURES:
        return None
    from engine.models.registry import MODEL_TYPES

    row = MODEL_TYPES.get(checkpoint.hf_config.model_type)
    if row is None or not row.family.decoder:
        raise UnsupportedModel(
            f"model {checkpoint.name!r}: posy runs {checkpoint.architecture} on the decoders it packs"
        )
    return ListwiseSpec(
        listwise=read_listwise(checkpoint.name, checkpoint.transformer_dir / "tokenizer.json")
    )
