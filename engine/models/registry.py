"""Which Backbone, variant and head serve a checkpoint: one table keyed by its config's model_type gives
the family (backbone, heads, default pooling), its bare model's name and the variant's switches the
backbone parses the config with; the architecture's name gives the head."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from torch import nn

from engine.attention import AttentionBackend
from engine.checkpoint.cross_encoder import read_cross_encoder
from engine.checkpoint.files import ties_word_embeddings
from engine.checkpoint.sentence_transformers import sentence_transformers_pooling
from engine.checkpoint.source import POOLING_FLAGS
from engine.checkpoint.splade import is_m3_folder
from engine.errors import UnsupportedModel
from engine.models import bert, clip, decoder, paligemma, vision_language
from engine.models.backbone import Backbone
from engine.models.bert import BertBackbone
from engine.models.bge_m3 import M3Spec
from engine.models.clip import DualEncoderBackbone
from engine.models.decoder import DecoderBackbone
from engine.models.dual_encoder import detect_dual_encoder
from engine.models.fallback import TransformersBackbone
from engine.models.head_spec import HeadSpec
from engine.models.heads import ClassifierSpec, EmbedderSpec, JudgeSpec
from engine.models.late_interaction import detect_colbert
from engine.models.listwise import detect_listwise
from engine.models.modernbert import ModernBertBackbone
from engine.models.paligemma import PaliGemmaBackbone
from engine.models.sparse import detect_splade
from engine.models.token_classifier import detect_token_classifier
from engine.models.vision_language import VisionLanguageBackbone
from engine.models.vision_language_ranker import detect_vision_language_ranker

if TYPE_CHECKING:
    from engine.checkpoint.folder import Checkpoint
    from engine.checkpoint.spec import ModelSpec

# the head an architecture's name ends in: "embed" pools the bare model, "classify" is a
# sequence-classification head (cross-encoders), "judge" a causal LM's yes/no logits (rerankers)
HEAD_SUFFIXES = {
    "Model": "embed",
    "ForSequenceClassification": "classify",
    "ForCausalLM": "judge",
    # a vision-language model's generative checkpoint, embedded as its bare model (gme-Qwen2-VL)
    "ForConditionalGeneration": "embed",
}
# sentence-transformers runs checkpoints of these heads as the bare model (e.g. "BertForMaskedLM", or
# Qwen3-Embedding's "Qwen3ForCausalLM")
RUN_BARE = ("ForMaskedLM", "ForPreTraining", "ForCausalLM")
# a judge's name as model cards write it (lower case), by its pair format
JUDGE_NAMES = {"qwen3-judge": "qwen3-reranker"}
# architectures transformers names outside their model type's prefix -> the name the prefix rule reads
ARCHITECTURE_ALIASES = {
    "Gemma3ForCausalLM": "Gemma3TextForCausalLM",
    "PPLXQwen3ContextualModel": "PPLXQwen3Model",  # pplx-embed-context: the same model, its chunks joined
}


@dataclass(frozen=True, slots=True)
class Family:
    backbone: type[Backbone]
    heads: tuple[str, ...]
    pooling: str  # an embedder's when the model ships no sentence-transformers pooling config
    # a decoder (causal by default), and whether its embedder may run bidirectionally (pplx-embed style)
    # when its config says `is_causal: false` or the server is started with --bidirectional
    decoder: bool = False
    can_be_bidirectional: bool = False
    # how rerank lays out a (query, document) pair for its judge, and for a sequence-classification
    # conversion of that judge: "qwen3-judge" is Qwen3-Reranker's chat prompt asking for yes or no
    judge_format: str = "pair"


BERT = Family(BertBackbone, ("embed", "classify"), pooling="mean")
MODERNBERT = Family(ModernBertBackbone, ("embed", "classify"), pooling="mean")
# Qwen3-Embedding: last token (its tokenizer appends <|endoftext|>); Qwen3-Reranker ships as a bare
# causal LM (no sentence-transformers files): P("yes") of its judgment
QWEN3 = Family(
    DecoderBackbone,
    ("embed", "classify", "judge"),
    "last",
    decoder=True,
    can_be_bidirectional=True,
    judge_format="qwen3-judge",
)
# gte-Qwen2, e5-mistral, SFR-Embedding and the like: causal, last token (as their sentence-transformers
# files say), and bidirectional where their config or --bidirectional asks
DECODER = Family(DecoderBackbone, ("embed", "classify"), "last", decoder=True, can_be_bidirectional=True)
# Gemma and Gemma3 text models: EmbeddingGemma (bidirectional, as its config's use_bidirectional_attention
# says, so mean-pooled) and causal ones, last token; the config alone sets the mask (no --bidirectional)
GEMMA = Family(DecoderBackbone, ("embed", "classify"), "last", decoder=True)
# pplx-embed and pplx-embed-context (their remote PPLXQwen3Model, run without its code): Qwen3 blocks without
# a causal mask, as their config says, mean-pooled
PPLX = Family(DecoderBackbone, ("embed",), "mean", decoder=True)
# CLIP, SigLIP and SigLIP2: a text tower and a vision tower (engine/models/dual_encoder.py is their head)
DUAL_ENCODER = Family(DualEncoderBackbone, ("embed",), "last")
# Qwen2-VL and Qwen3-VL: a decoder over texts that hold images (engine/models/vision_language.py), last token
VISION_LANGUAGE = Family(VisionLanguageBackbone, ("embed",), "last", decoder=True)
# PaliGemma: ColPali's backbone, a bidirectional decoder over its image's patches and text (a token embedder
# replaces its head: engine/models/late_interaction.py)
PALIGEMMA = Family(PaliGemmaBackbone, ("embed",), "mean", decoder=True)
# any other architecture, through transformers (engine/models/fallback.py): mean-pooled, normalized
FALLBACK = Family(TransformersBackbone, ("embed", "classify"), pooling="mean")


@dataclass(frozen=True, slots=True)
class ModelType:
    """A row of the table: a model_type's family, the architecture name of its bare model, and the
    variant record (bert.BertVariant, decoder.DecoderVariant) its backbone parses the config with; None
    for a family without variants."""

    family: Family
    bare: str
    variant: Any = None


# the one table of what posy packs: model_type -> its row
MODEL_TYPES: dict[str, ModelType] = {
    "bert": ModelType(BERT, "BertModel", bert.BERT),
    "roberta": ModelType(BERT, "RobertaModel", bert.ROBERTA),
    "xlm-roberta": ModelType(BERT, "XLMRobertaModel", bert.ROBERTA),
    "camembert": ModelType(BERT, "CamembertModel", bert.ROBERTA),
    "distilbert": ModelType(BERT, "DistilBertModel", bert.DISTILBERT),
    "mpnet": ModelType(BERT, "MPNetModel", bert.MPNET),
    "modernbert": ModelType(MODERNBERT, "ModernBertModel"),
    "qwen3": ModelType(QWEN3, "Qwen3Model", decoder.QWEN3),
    "bidirectional_pplx_qwen3": ModelType(PPLX, "PPLXQwen3Model", decoder.PPLX_QWEN3),
    "qwen2": ModelType(DECODER, "Qwen2Model", decoder.QWEN2),
    "llama": ModelType(DECODER, "LlamaModel", decoder.LLAMA),
    "mistral": ModelType(DECODER, "MistralModel", decoder.MISTRAL),
    "gemma": ModelType(GEMMA, "GemmaModel", decoder.GEMMA),
    "gemma3_text": ModelType(GEMMA, "Gemma3TextModel", decoder.GEMMA3),
    "clip": ModelType(DUAL_ENCODER, "CLIPModel", clip.CLIP),
    "siglip": ModelType(DUAL_ENCODER, "SiglipModel", clip.SIGLIP),
    "siglip2": ModelType(DUAL_ENCODER, "Siglip2Model", clip.SIGLIP2),
    "qwen2_vl": ModelType(VISION_LANGUAGE, "Qwen2VLModel", vision_language.QWEN2_VL),
    "qwen3_vl": ModelType(VISION_LANGUAGE, "Qwen3VLModel", vision_language.QWEN3_VL),
    "paligemma": ModelType(PALIGEMMA, paligemma.BARE, paligemma.TEXT),
}


@dataclass(frozen=True, slots=True)
class ModelEntry:
    family: Family
    architecture: str  # as served: the bare model's name where sentence-transformers runs it bare
    head: str
    variant: Any = None  # the model type's (ModelType.variant)

    @property
    def task(self) -> str:
        return "embed" if self.head == "embed" else "score"

    @property
    def pooling(self) -> str:
        # a cross-encoder's head reads the first token (<s> or [CLS]), a judge the last
        return {"embed": self.family.pooling, "classify": "cls", "judge": "last"}[self.head]

    @property
    def normalize(self) -> bool:  # logits are never normalized
        return self.head == "embed"

    @property
    def pair_format(self) -> str:
        return self.family.judge_format if self.head == "judge" else "pair"

    def pair_format_of(self, model_card: str) -> str:
        """A classifier converted from the family's judge (its model card names the judge, as
        Qwen3-Reranker's seq-cls conversions do) lays pairs out as the judge does."""
        judge = self.family.judge_format
        if self.head == "classify" and judge != "pair" and JUDGE_NAMES.get(judge, "") in model_card.lower():
            return judge
        return self.pair_format

    @property
    def can_be_bidirectional(self) -> bool:
        return self.family.can_be_bidirectional and self.head == "embed"


def lookup(
    architecture: str, model_type: str, sentence_transformers: bool = False, judge: bool = False
) -> ModelEntry:
    """The family and head of a checkpoint; `sentence_transformers`: its folder has modules.json;
    `judge`: a sentence-transformers LogitScore module makes any decoder's causal LM a judge."""
    if model_type in MODEL_TYPES:
        row = MODEL_TYPES[model_type]
        family, prefix = row.family, row.bare.removesuffix("Model")
        name = ARCHITECTURE_ALIASES.get(architecture, architecture)
        if sentence_transformers and name.startswith(prefix) and name.endswith(RUN_BARE):
            name = row.bare
        head = HEAD_SUFFIXES.get(name.removeprefix(prefix)) if name.startswith(prefix) else None
        if head in family.heads or (judge and head == "judge" and family.decoder):
            return ModelEntry(family, name, head, row.variant)
    raise UnsupportedModel(
        f"architecture {architecture!r} is not supported; supported: {', '.join(supported())}"
    )


def spec_entry(spec: ModelSpec) -> ModelEntry:
    """The packed family and head of a spec read_spec read."""
    return lookup(spec.architecture, spec.hf_config.model_type, judge=spec.logit_score is not None)


def fallback_entry(architecture: str, sentence_transformers: bool = False) -> ModelEntry:
    """How transformers' own class serves an architecture posy does not pack: a sequence classifier
    whole, anything else as its bare model where it is one or sentence-transformers runs it so."""
    if architecture.endswith("ForSequenceClassification"):
        return ModelEntry(FALLBACK, architecture, "classify")
    bare = architecture.endswith("Model") and not architecture.endswith(("HeadModel", "HeadsModel"))
    if bare or sentence_transformers:
        return ModelEntry(FALLBACK, architecture, "embed")
    # a masked LM has no pooling of its own: sentence-transformers' SparseEncoder runs it as SPLADE
    splade = "; --pooling splade serves a masked LM as SPLADE" if architecture.endswith("ForMaskedLM") else ""
    raise UnsupportedModel(
        f"architecture {architecture!r} is not supported: posy packs {', '.join(supported())}; transformers "
        "runs a bare *Model, a *ForSequenceClassification, or a checkpoint with sentence-transformers "
        f"files{splade}"
    )


def supported() -> list[str]:
    names = []
    for row in MODEL_TYPES.values():
        prefix = row.bare.removesuffix("Model")
        names += [prefix + suffix for suffix, head in HEAD_SUFFIXES.items() if head in row.family.heads]
    return names


# the heads that replace a checkpoint's own, each found by its detector, in this order (a checkpoint none
# claims is served with its architecture's head: architecture_head); a new head adds its row
HEAD_DETECTORS: tuple[Callable[[Checkpoint], HeadSpec | None], ...] = (
    detect_dual_encoder,
    detect_colbert,
    detect_splade,
    detect_listwise,
    detect_token_classifier,
    detect_vision_language_ranker,
)


def detect_head(checkpoint: Checkpoint) -> HeadSpec | None:
    """The first detected head, if any."""
    for detect in HEAD_DETECTORS:
        head = detect(checkpoint)
        if head is not None:
            return head
    return None


def architecture_head(
    checkpoint: Checkpoint, entry: ModelEntry, packed: bool, bidirectional: bool
) -> HeadSpec:
    """The head of the checkpoint's architecture (its entry's): an embedder pooled as its
    sentence-transformers files (or --pooling) say, bge-m3's where its extra heads are beside it; a
    classifier; or a judge, a sentence-transformers CrossEncoder's LogitScore one where it has that."""
    name, hf_config = checkpoint.name, checkpoint.hf_config
    if checkpoint.cross_encoder:
        modules = checkpoint.modules or []
        logit_score = read_cross_encoder(
            name, checkpoint.folder, checkpoint.transformer_dir, entry.architecture, entry.head, modules
        )
        if logit_score is not None:
            if getattr(hf_config, "final_logit_softcapping", None) is not None:
                raise UnsupportedModel(f"model {name!r}: a judge of soft-capped LM logits is not supported")
            tied = ties_word_embeddings(hf_config)
            return JudgeSpec(num_labels=1, logit_score=logit_score, tied=tied)
    if entry.head == "classify":
        return ClassifierSpec(num_labels=hf_config.num_labels)
    if entry.head == "judge":
        return JudgeSpec(num_labels=hf_config.num_labels, tied=ties_word_embeddings(hf_config))
    # a bidirectional decoder has no last token that saw the whole text: it is mean-pooled
    pooling, normalize, dense = ("mean" if bidirectional else entry.pooling), entry.normalize, ()
    if checkpoint.modules is not None:
        pooling, normalize, dense = sentence_transformers_pooling(name, checkpoint.folder, checkpoint.modules)
    if checkpoint.pooling_flag is not None and checkpoint.pooling_flag != "splade":
        pooling = POOLING_FLAGS[checkpoint.pooling_flag]
    if packed and pooling == "cls" and is_m3_folder(checkpoint.folder):
        return M3Spec(normalize=normalize, dense=dense)
    return EmbedderSpec(pooling=pooling, normalize=normalize, dense=dense)


def build_model(spec: ModelSpec, attention_backend: AttentionBackend) -> nn.Module:
    """The spec's backbone under its head (on the current default device; weights not loaded)."""
    backbone = spec_entry(spec).family.backbone.from_spec(spec, attention_backend)
    model = spec.head.build(backbone, spec)
    image_token = getattr(backbone, "image_token", None)
    if image_token is not None:  # any head over it takes images inside its sequences
        run = (image_token, spec.images.merge)
        model.output = msgspec.structs.replace(model.output, takes_images=True, image_run=run)
    return model
