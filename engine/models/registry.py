"""HF architecture name -> our model class, its tasks, and its pooling when the model ships none."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from engine.errors import UnsupportedModel
from engine.models.bert import BertClassifier, BertEmbedder
from engine.models.modernbert import ModernBertClassifier, ModernBertEmbedder
from engine.models.qwen3 import Qwen3Embedder, Qwen3Judge


@dataclass(frozen=True, slots=True)
class ModelEntry:
    model_class: type[nn.Module]  # has from_spec(spec, attention_backend), weight_map(), ignored_weights
    tasks: tuple[str, ...]  # "embed" and/or "score"
    pooling: str  # default when the model ships no sentence-transformers pooling config
    normalize: bool
    # how rerank lays out a (query, document) pair: "pair" is the tokenizer's own pair template
    # ([CLS] q [SEP] d [SEP]); "qwen3-judge" is Qwen3-Reranker's chat prompt asking for yes or no
    pair_format: str = "pair"
    # a decoder (causal by default), and whether it may run bidirectionally (pplx-embed style) when
    # its config says `is_causal: false` or the server is started with --bidirectional
    decoder: bool = False
    can_be_bidirectional: bool = False


EMBEDDER = ModelEntry(BertEmbedder, tasks=("embed",), pooling="mean", normalize=True)
# a cross-encoder's head reads the first token (<s> or [CLS]); its logits are never normalized
CROSS_ENCODER = ModelEntry(BertClassifier, tasks=("score",), pooling="cls", normalize=False)
MODERNBERT_EMBEDDER = ModelEntry(ModernBertEmbedder, tasks=("embed",), pooling="mean", normalize=True)
# its head pools as the config's classifier_pooling says ("cls" or "mean")
MODERNBERT_CROSS_ENCODER = ModelEntry(ModernBertClassifier, tasks=("score",), pooling="cls", normalize=False)
# Qwen3-Embedding: last token (its tokenizer appends <|endoftext|>), normalized; bidirectional: mean
QWEN3_EMBEDDER = ModelEntry(
    Qwen3Embedder, ("embed",), pooling="last", normalize=True, decoder=True, can_be_bidirectional=True
)
# Qwen3-Reranker ships as a bare causal LM (no sentence-transformers files): P("yes") of its judgment
QWEN3_JUDGE = ModelEntry(
    Qwen3Judge, ("score",), pooling="last", normalize=False, pair_format="qwen3-judge", decoder=True
)

ARCHITECTURES: dict[str, ModelEntry] = {
    "BertModel": EMBEDDER,
    "RobertaModel": EMBEDDER,
    "XLMRobertaModel": EMBEDDER,
    "BertForSequenceClassification": CROSS_ENCODER,
    "RobertaForSequenceClassification": CROSS_ENCODER,
    "XLMRobertaForSequenceClassification": CROSS_ENCODER,
    "ModernBertModel": MODERNBERT_EMBEDDER,
    "ModernBertForSequenceClassification": MODERNBERT_CROSS_ENCODER,
    "Qwen3Model": QWEN3_EMBEDDER,
    "Qwen3ForCausalLM": QWEN3_JUDGE,
}

# sentence-transformers loads any checkpoint of these model types as the bare encoder (e.g. "BertForMaskedLM",
# or Qwen3-Embedding's "Qwen3ForCausalLM")
ENCODER_OF_MODEL_TYPE = {
    "bert": "BertModel",
    "roberta": "RobertaModel",
    "xlm-roberta": "XLMRobertaModel",
    "modernbert": "ModernBertModel",
    "qwen3": "Qwen3Model",
}


def lookup(architecture: str) -> ModelEntry:
    if architecture not in ARCHITECTURES:
        known = ", ".join(ARCHITECTURES)
        raise UnsupportedModel(f"architecture {architecture!r} is not supported; supported: {known}")
    return ARCHITECTURES[architecture]
