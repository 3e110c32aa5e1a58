"""TokenEmbedder: a ColBERT model's head, a unit vector for every token (late interaction scores a query
against a document by the sum over its token vectors of the best match among the document's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.checkpoint.colbert import (
    MULTI_VECTOR_VISION,
    ColbertConfig,
    colbert_projection,
    is_colbert_folder,
    read_colbert,
    read_multi_vector_vision,
)
from engine.checkpoint.files import read_json
from engine.errors import UnsupportedModel
from engine.models.backbone import Backbone
from engine.models.dense import Dense, DenseLayout
from engine.models.head_spec import HeadSpec
from engine.models.heads import Head, dense_targets
from engine.outputs import RERANK, TOKEN, TOKEN_EMBED, HeadOutput

if TYPE_CHECKING:
    from engine.checkpoint.folder import Checkpoint
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets


class TokenEmbedder(Head):
    """Every token's final hidden state through the projection (PyLate's Dense modules, colbert-ai's
    `linear`, ColQwen2's `embedding_proj_layer`), L2-normalized, float32: a row a token. Which rows a
    caller keeps (a document's punctuation is dropped) is the caller's; `query_only_token` is the token
    whose trailing run in a sequence attends without being a key (a query's expansion, engine/batch.pack);
    a request's prefix is a query its sequences are scored against (max_sim)."""

    def __init__(
        self,
        backbone: Backbone,
        dense: Sequence[DenseLayout],
        query_only_token: int | None = None,
        linear_name: str | None = None,
        skiplist_ids: Sequence[int] = (),
        wrapped_in: str = "",
    ):
        super().__init__(backbone)
        if wrapped_in:  # the backbone's names under a wrapper's (ColQwen2's "vlm.")
            prefixes = (*backbone.checkpoint_prefixes, "")
            self.checkpoint_prefixes = tuple(wrapped_in + prefix for prefix in prefixes)
        self.dense = nn.ModuleList(Dense(layout) for layout in dense)
        width = dense[-1].out_features if dense else backbone.hidden_size
        self.output = HeadOutput(
            TOKEN, width, (TOKEN_EMBED, RERANK), query_only_token=query_only_token, scores_prefix=True
        )
        self.linear_name = linear_name
        self.skiplist_ids = np.array(sorted(skiplist_ids), dtype=np.int64)
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

    def max_sim(self, batch: PackedBatch, rows: torch.Tensor) -> torch.Tensor:
        """The rows of a batch whose sequences may be scored against a query in it (batch.scored_against,
        host) from forward's token rows (on the device, graph padding after them): a scored sequence gives
        one row, its MaxSim in column 0 (the sum over the query's vectors of their best dot product with
        the sequence's vectors but those of skiplist tokens; 0 where none is left); a query gives none;
        any other sequence its token rows. The host does index arithmetic only; the device, the rest."""
        against = batch.scored_against.numpy()
        lengths = np.diff(batch.cu_seqlens.numpy()).astype(np.int64)
        starts = batch.cu_seqlens.numpy()[:-1].astype(np.int64)
        scored = np.flatnonzero(against >= 0)
        kept = ~np.isin(batch.input_ids.numpy(), self.skiplist_ids)
        scores = torch.zeros(len(scored), device=rows.device)
        for query in np.unique(against[scored]):
            members = np.flatnonzero(against[scored] == query)  # positions among the scored
            tokens = np.concatenate([np.arange(starts[i], starts[i] + lengths[i]) for i in scored[members]])
            owner = np.repeat(np.arange(len(members)), lengths[scored[members]])
            tokens, owner = tokens[kept[tokens]], owner[kept[tokens]]
            queries = rows[starts[query] : starts[query] + lengths[query]]
            similarity = rows[torch.from_numpy(tokens).to(rows.device)] @ queries.T  # [tokens, query tokens]
            index = torch.from_numpy(owner).to(rows.device)[:, None].expand_as(similarity)
            best = similarity.new_zeros(len(members), len(queries))
            best.scatter_reduce_(0, index, similarity, "amax", include_self=False)  # 0 for a doc without one
            scores[torch.from_numpy(members).to(rows.device)] = best.sum(dim=1)
        # the output: token rows, then score rows, gathered in the sequences' order
        num_tokens = int(starts[-1] + lengths[-1])
        score_rows = F.pad(scores[:, None], (0, rows.shape[1] - 1))
        is_query = np.zeros(len(lengths), dtype=bool)
        is_query[against[scored]] = True
        order = []
        for i, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
            if against[i] >= 0:
                order.append(np.array([num_tokens + np.searchsorted(scored, i)]))
            elif not is_query[i]:
                order.append(np.arange(start, start + length))
        gather = torch.from_numpy(np.concatenate(order)).to(rows.device)
        return torch.cat([rows[:num_tokens], score_rows]).index_select(0, gather)

    def weight_map(self) -> WeightTargets:
        return {**super().weight_map(), **dense_targets(self.dense, self.linear_name)}


@dataclass(frozen=True, slots=True)
class ColbertSpec(HeadSpec):
    task: str = "token_embed"
    normalize: bool = True
    replaces_head: bool = True
    colbert: ColbertConfig | None = None

    def window(self, window: int, sentence_transformers_length: int | None) -> int:
        # PyLate sets the Transformer's length to the query's or the document's each call
        return min(window, self.colbert.window)

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        colbert = self.colbert
        linear_name = colbert.linear_name if colbert.linear_dim is not None else None
        return TokenEmbedder(
            backbone, self.dense, colbert.query_only_token(), linear_name, colbert.skiplist_ids,
            colbert.wrapped_in,
        )  # fmt: skip

    def extra_tensors(self, spec: ModelSpec) -> dict[str, torch.Tensor]:
        # colbert-ai's projection is in the checkpoint itself
        return {} if self.colbert.linear_dim is not None else HeadSpec.extra_tensors(self, spec)


def detect_colbert(checkpoint: Checkpoint) -> ColbertSpec | None:
    """A PyLate folder, a colbert-ai one, or a multi-vector image retriever (ColQwen2, ColPali)."""
    name, hf_config = checkpoint.name, checkpoint.hf_config
    if checkpoint.architecture in MULTI_VECTOR_VISION:
        if hf_config.model_type != MULTI_VECTOR_VISION[checkpoint.architecture].model_type:
            raise UnsupportedModel(f"model {name!r}: {checkpoint.architecture} over {hf_config.model_type}")
        folder = checkpoint.transformer_dir
        own = read_json(folder / "config.json")
        colbert = read_multi_vector_vision(name, folder, own, checkpoint.architecture, hf_config)
        hidden = hf_config.get_text_config().hidden_size
        dense = colbert_projection(name, checkpoint.folder, None, hidden, colbert)
        return ColbertSpec(dense=dense, colbert=colbert)
    if not is_colbert_folder(checkpoint.folder, checkpoint.modules, checkpoint.hf_config):
        return None
    name, folder, modules = checkpoint.name, checkpoint.folder, checkpoint.modules
    colbert = read_colbert(name, folder, checkpoint.transformer_dir, modules)
    dense = colbert_projection(name, folder, modules, checkpoint.hf_config.hidden_size, colbert)
    return ColbertSpec(dense=dense, colbert=colbert)
