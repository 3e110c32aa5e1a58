"""jina-reranker-m0's head: Qwen2-VL (its LM head an identity) scoring a pair by an MLP over its last token,
a score token appended after the pair (scoring/templates.JINA_M0 lays pairs out), its logit shifted by
-2.65 so that its sigmoid is the model's relevance (the modeling code's LOGIT_BIAS). The checkpoint names
the head `score.0` (dense, bias), a ReLU, and `score.2` (one logit, bias)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import UnsupportedModel
from engine.models.backbone import ClassifierLayout
from engine.models.heads import ClassifierSpec

if TYPE_CHECKING:
    from engine.checkpoint.folder import Checkpoint

ARCHITECTURE = "JinaVLForRanking"
LAYOUT = ClassifierLayout(
    out="score.2", dense="score.0", activation="relu", pooling="last", logit_offset=-2.65
)


def detect_vision_language_ranker(checkpoint: Checkpoint) -> ClassifierSpec | None:
    if checkpoint.architecture != ARCHITECTURE:
        return None
    if checkpoint.hf_config.model_type != "qwen2_vl":
        raise UnsupportedModel(
            f"model {checkpoint.name!r}: {ARCHITECTURE} over a {checkpoint.hf_config.model_type} model"
        )
    return ClassifierSpec(num_labels=1, pooling="last", layout=LAYOUT, pair_format="jina-m0")
