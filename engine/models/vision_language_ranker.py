"""Vision-language rankers over the packed Qwen2-VL / Qwen3-VL backbone, each pair one sequence:

- jina-reranker-m0 (JinaVLForRanking): Qwen2-VL (its LM head an identity) scoring a pair by an MLP over
  its last token, a score token appended after the pair (scoring/templates.JINA_M0 lays pairs out), its
  logit shifted by -2.65 so that its sigmoid is the model's relevance (the modeling code's LOGIT_BIAS).
  The checkpoint names the head `score.0` (dense, bias), a ReLU, and `score.2` (one logit, bias).
- Qwen3-VL-Reranker: a Qwen3VLForConditionalGeneration checkpoint, as Qwen3-VL-Embedding's is, that its
  model card files under text ranking (`pipeline_tag: text-ranking`); it judges "yes" or "no" after its
  chat prompt (scoring/templates.QWEN3_VL_JUDGE), read from those two rows of its LM head."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.checkpoint.files import model_card_pipeline_tag, ties_word_embeddings
from engine.errors import UnsupportedModel
from engine.models.backbone import ClassifierLayout
from engine.models.heads import ClassifierSpec, JudgeSpec

if TYPE_CHECKING:
    from engine.checkpoint.folder import Checkpoint
    from engine.models.head_spec import HeadSpec

ARCHITECTURE = "JinaVLForRanking"
LAYOUT = ClassifierLayout(
    out="score.2", dense="score.0", activation="relu", pooling="last", logit_offset=-2.65
)
JUDGE_ARCHITECTURE = "Qwen3VLForConditionalGeneration"

logger = logging.getLogger(__name__)


def detect_vision_language_ranker(checkpoint: Checkpoint) -> HeadSpec | None:
    if checkpoint.architecture == JUDGE_ARCHITECTURE:
        tag = model_card_pipeline_tag(checkpoint.folder)
        if tag is None:  # the two share their config: only the card tells them apart
            logger.warning(
                "%s: no model card names its task; served as an embedder (Qwen3-VL-Embedding). A "
                "Qwen3-VL-Reranker is served as one with its README.md (pipeline_tag: text-ranking)",
                checkpoint.name,
            )
        if tag != "text-ranking":
            return None  # an embedder (Qwen3-VL-Embedding) or a chat model
        tied = ties_word_embeddings(checkpoint.hf_config)
        return JudgeSpec(num_labels=2, pooling="last", tied=tied, pair_format="qwen3-vl-judge")
    if checkpoint.architecture != ARCHITECTURE:
        return None
    if checkpoint.hf_config.model_type != "qwen2_vl":
        raise UnsupportedModel(
            f"model {checkpoint.name!r}: {ARCHITECTURE} over a {checkpoint.hf_config.model_type} model"
        )
    return ClassifierSpec(num_labels=1, pooling="last", layout=LAYOUT, pair_format="jina-m0")
