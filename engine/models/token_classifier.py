"""TokenClassifier: a *ForTokenClassification checkpoint (NER and other taggers): every token's label
logits, a row a token, float32, as transformers' own class gives them (its dropout is off at inference).
Served by /pooling with task "token_classify", as vLLM names it; the rows are raw logits (softmax and
id2label are the client's)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.models.backbone import Backbone, ClassifierLayout
from engine.models.decoder import DecoderBackbone
from engine.models.head_spec import HeadSpec
from engine.models.heads import Classifier
from engine.models.modernbert import ModernBertBackbone
from engine.outputs import TOKEN, HeadOutput

if TYPE_CHECKING:
    from engine.checkpoint.folder import Checkpoint
    from engine.checkpoint.spec import ModelSpec

TOKEN_CLASSIFY = "token_classify"


class TokenClassifier(Classifier):
    """The classifier's layers over every token's finished hidden state instead of a pooled one."""

    def __init__(self, backbone: Backbone, layout: ClassifierLayout, num_labels: int):
        super().__init__(backbone, layout, num_labels)
        self.output = HeadOutput(TOKEN, num_labels, (TOKEN_CLASSIFY,))

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, num_labels] float32
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        return self.labels(self.backbone.finish(self.backbone.encode(batch, meta)))


def token_layout(backbone: Backbone, spec: ModelSpec) -> ClassifierLayout:
    """Each family's *ForTokenClassification head, by its checkpoint names."""
    if isinstance(backbone, DecoderBackbone):  # transformers' generic one: `score`, a bias unless unset
        return ClassifierLayout(
            out="score", out_bias=getattr(spec.hf_config, "token_classification_bias", True)
        )
    if isinstance(backbone, ModernBertBackbone):  # its prediction head (dense, activation, norm) first
        return replace(backbone.classifier_layout(), pooling="none")
    return ClassifierLayout(out="classifier")  # BERT, RoBERTa, XLM-R, DistilBERT, MPNet


@dataclass(frozen=True, slots=True)
class TokenClassifierSpec(HeadSpec):
    task: str = TOKEN_CLASSIFY
    pooling: str = "none"
    replaces_head: bool = True  # the bare model under this head

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        return TokenClassifier(backbone, token_layout(backbone, spec), self.num_labels or 1)


def detect_token_classifier(checkpoint: Checkpoint) -> TokenClassifierSpec | None:
    if not checkpoint.architecture.endswith("ForTokenClassification"):
        return None
    return TokenClassifierSpec(num_labels=checkpoint.hf_config.num_labels)
