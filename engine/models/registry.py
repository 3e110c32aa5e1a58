"""HF architecture name -> our model class, its tasks, and its pooling when the model ships none."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from engine.errors import UnsupportedModel
from engine.models.bert import BertClassifier, BertEmbedder


@dataclass(frozen=True, slots=True)
class ModelEntry:
    model_class: type[nn.Module]  # has from_spec(spec, attention_backend), weight_map(), ignored_weights
    tasks: tuple[str, ...]  # "embed" and/or "score"
    pooling: str  # default when the model ships no sentence-transformers pooling config
    normalize: bool


EMBEDDER = ModelEntry(BertEmbedder, tasks=("embed",), pooling="mean", normalize=True)
# a cross-encoder's head reads the first token (<s> or [CLS]); its logits are never normalized
CROSS_ENCODER = ModelEntry(BertClassifier, tasks=("score",), pooling="cls", normalize=False)

ARCHITECTURES: dict[str, ModelEntry] = {
    "BertModel": EMBEDDER,
    "RobertaModel": EMBEDDER,
    "XLMRobertaModel": EMBEDDER,
    "BertForSequenceClassification": CROSS_ENCODER,
    "RobertaForSequenceClassification": CROSS_ENCODER,
    "XLMRobertaForSequenceClassification": CROSS_ENCODER,
}

# sentence-transformers loads any checkpoint of these model types as the bare encoder (e.g. "BertForMaskedLM")
ENCODER_OF_MODEL_TYPE = {"bert": "BertModel", "roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel"}


def lookup(architecture: str) -> ModelEntry:
    if architecture not in ARCHITECTURES:
        known = ", ".join(ARCHITECTURES)
        raise UnsupportedModel(f"architecture {architecture!r} is not supported; supported: {known}")
    return ARCHITECTURES[architecture]
