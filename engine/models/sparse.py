"""SPLADE: a masked-LM's logits over the vocabulary, log(1 + relu(logit)) (twice for OpenSearch's
"log1p_relu"), pooled over each sequence's tokens by max (or sum): one row of vocabulary weights a
sequence, nearly all of them zero."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.checkpoint.files import ties_word_embeddings
from engine.checkpoint.splade import SpladeConfig, bare_splade, is_splade_folder, read_splade
from engine.layers.activations import get_activation
from engine.models.backbone import Backbone
from engine.models.head_spec import HeadSpec
from engine.models.heads import Head
from engine.outputs import SEQUENCE, SPARSE_EMBED, HeadOutput

if TYPE_CHECKING:
    from engine.checkpoint.folder import Checkpoint
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets

# tokens whose vocabulary-wide logits are computed at once: bounds the head's memory (2,048 x 30,522 bf16 is
# 125 MB; an XLM-R vocabulary's 1 GB) whatever the batch
LOGIT_CHUNK_TOKENS = 2048
# the vocabulary projection's rows padded to a multiple of this (zero weights and bias: weight 0, which the
# pooling from 0 keeps and the rows drop): on the H200 BERT's 30,522 rows, unaligned, ran an sm80 GEMM at
# 232 TFLOPS, a third of SPLADE's step
VOCAB_ALIGNMENT = 64


class MlmHead(nn.Module):
    """dense -> activation -> LayerNorm -> decoder over the vocabulary (+ bias)."""

    def __init__(self, hidden_size: int, vocab_size: int, activation: str, norm_eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.act = get_activation(activation)
        self.norm = nn.LayerNorm(hidden_size, eps=norm_eps)
        self.decoder = nn.Linear(hidden_size, vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # [n, hidden] -> [n, vocab_size] logits (after pad_vocabulary: [n, its padded size])
        return self.decoder(self.norm(self.act(self.dense(hidden))))

    def pad_vocabulary(self) -> None:
        """Pad the decoder's rows to a multiple of VOCAB_ALIGNMENT, with zeros (a tied decoder's then its
        own copy of the embeddings)."""
        decoder = self.decoder
        vocab_size = decoder.out_features
        padded = -(-vocab_size // VOCAB_ALIGNMENT) * VOCAB_ALIGNMENT
        if padded == vocab_size:
            return
        weight = decoder.weight.new_zeros(padded, decoder.in_features)
        weight[:vocab_size] = decoder.weight
        bias = decoder.bias.new_zeros(padded)
        bias[:vocab_size] = decoder.bias
        self.decoder = nn.Linear(decoder.in_features, padded, device=weight.device, dtype=weight.dtype)
        self.decoder.weight, self.decoder.bias = nn.Parameter(weight, False), nn.Parameter(bias, False)


class SpladeEncoder(Head):
    """[num_seqs, vocab_size] float32 weights, computed LOGIT_CHUNK_TOKENS tokens at a time."""

    def __init__(self, backbone: Backbone, vocab_size: int, splade: SpladeConfig, tied: bool):
        super().__init__(backbone)
        self.layout = backbone.mlm_layout()
        config = backbone.config
        activation = self.layout.activation or config.hidden_act
        norm_eps = self.layout.norm_eps or config.layer_norm_eps
        self.mlm = MlmHead(backbone.hidden_size, vocab_size, activation, norm_eps)
        self.vocab_size = vocab_size
        self.output = HeadOutput(SEQUENCE, vocab_size, (SPARSE_EMBED,))
        self.splade = splade
        self.tied = tied
        # the pooler and the other pretraining heads are not read; a tied decoder's saved copy neither
        layout = self.layout
        read = [f"{name}." for name in (layout.dense, layout.norm, layout.decoder, layout.bias)]
        others = tuple(
            head for head in backbone.pretraining_heads if not any(n.startswith(head) for n in read)
        )
        tied_copy = (f"{layout.decoder}.weight",) if tied else ()
        self.ignored_weights = (*backbone.ignored_weights, *others, *layout.bias_aliases, *tied_copy)

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, vocab_size] float32
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        hidden = self.backbone.finish(self.backbone.encode(batch, meta))
        if self.splade.pooling == "max":
            weights = self.activate(self.pooled_logits(hidden, meta, "max"))
        else:
            weights = self.pooled_logits(hidden, meta, "sum", activated=True)
        return weights[:, : self.vocab_size].contiguous()

    def after_load(self) -> None:
        """Once the checkpoint is in: the vocabulary projection padded for aligned GEMMs."""
        self.mlm.pad_vocabulary()

    def pooled_logits(
        self, hidden: torch.Tensor, meta: AttentionMetadata, reduce: str, activated: bool = False
    ) -> torch.Tensor:
        """[num_tokens, hidden] -> [num_seqs, vocab_size]: each sequence's logits reduced over its tokens
        (`activated`: their weights, float32), LOGIT_CHUNK_TOKENS tokens at a time, from the device's
        cu_seqlens (no host sync). The max reduces raw logits in the model dtype (a max rounds nothing),
        from 0: relu's floor."""
        num_tokens, num_seqs = hidden.shape[0], meta.num_seqs
        starts, ends = meta.cu_seqlens[:-1].long(), meta.cu_seqlens[1:].long()
        dtype = torch.float32 if activated else hidden.dtype
        pooled = hidden.new_zeros(num_seqs, self.mlm.decoder.out_features, dtype=dtype)
        for first in range(0, num_tokens, LOGIT_CHUNK_TOKENS):
            last = min(first + LOGIT_CHUNK_TOKENS, num_tokens)
            logits = self.mlm(hidden[first:last])
            if activated:
                logits = self.activate(logits)
            counts = (ends.clamp(max=last) - starts.clamp(min=first)).clamp(min=0)
            part = torch.segment_reduce(logits, reduce, lengths=counts, axis=0, initial=0.0, unsafe=True)
            pooled = torch.maximum(pooled, part) if reduce == "max" else pooled + part
        return pooled

    def activate(self, logits: torch.Tensor) -> torch.Tensor:
        """log(1 + relu(x)) (twice for log1p_relu), float32. It rises with x, so the max of a sequence's
        weights is the weight of its largest logit: max pooling activates once a sequence, not a token."""
        weights = torch.log1p(torch.relu(logits.float()))
        return torch.log1p(weights) if self.splade.log_twice else weights

    def weight_map(self) -> WeightTargets:
        layout, targets = self.layout, super().weight_map()
        for checkpoint_name, module in ((layout.dense, "dense"), (layout.norm, "norm")):
            for leaf, _ in self.mlm.get_submodule(module).named_parameters(recurse=False):
                targets[f"{checkpoint_name}.{leaf}"] = (f"mlm.{module}.{leaf}", None)
        targets[layout.bias] = ("mlm.decoder.bias", None)
        if self.tied:
            embeddings = self.backbone.token_embeddings
            targets[embeddings] = [targets[embeddings], ("mlm.decoder.weight", None)]  # type: ignore[list-item]
        else:
            targets[f"{layout.decoder}.weight"] = ("mlm.decoder.weight", None)
        return targets


@dataclass(frozen=True, slots=True)
class SpladeSpec(HeadSpec):
    task: str = "sparse_embed"
    replaces_head: bool = True
    splade: SpladeConfig | None = None

    def output_dim(self, hf_config: Any) -> int:
        return hf_config.vocab_size

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        # the decoder over the vocabulary is the embedding table unless the config says otherwise
        tied = ties_word_embeddings(spec.hf_config)
        return SpladeEncoder(backbone, spec.vocab_size, self.splade, tied)


def detect_splade(checkpoint: Checkpoint) -> SpladeSpec | None:
    """A SparseEncoder folder (SpladePooling), or a bare masked LM served as SPLADE (--pooling splade)."""
    if is_splade_folder(checkpoint.kinds):
        return SpladeSpec(splade=read_splade(checkpoint.name, checkpoint.folder, checkpoint.modules or []))
    if checkpoint.pooling_flag == "splade":
        return SpladeSpec(splade=bare_splade(checkpoint.name, checkpoint.architecture, checkpoint.modules))
    return None
