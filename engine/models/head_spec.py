"""HeadSpec: a head as a checkpoint is read for it. A detector (a head's file defines it, registry's
HEAD_DETECTORS lists it) finds it in a Checkpoint; the spec says what the served model is (its task,
pooling, output size, window) and builds the head over its backbone. A new head is its own file: the
module, its HeadOutput, its HeadSpec and its detector, and one row of the table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.models.dense import CHECKPOINT_PREFIX as DENSE_PREFIX
from engine.models.dense import DenseLayout

if TYPE_CHECKING:
    import torch
    from torch import nn

    from engine.checkpoint.spec import ModelSpec
    from engine.models.backbone import Backbone


@dataclass(frozen=True, slots=True)
class HeadSpec:
    task: str = "embed"  # "embed" | "score" | "token_embed" | "sparse_embed", or a head's own
    pooling: str = "mean"  # "mean" | "cls" | "last": how an embedder pools, what a classifier reads
    normalize: bool = False
    num_labels: int | None = None  # a scorer's logits
    dense: tuple[DenseLayout, ...] = ()  # sentence-transformers Dense modules after the backbone
    # the checkpoint runs as its family's bare model under this head (its own head, if any, unread); such
    # heads run on the families posy packs only
    replaces_head: bool = False
    pair_format: str | None = None  # how rerank lays out a scorer's pairs, where not as its family does

    def output_dim(self, hf_config: Any) -> int:
        if self.num_labels:
            return self.num_labels
        return self.dense[-1].out_features if self.dense else hf_config.get_text_config().hidden_size

    def window(self, window: int, sentence_transformers_length: int | None) -> int:
        """The served window, from the backbone's and the one sentence-transformers sets (if any)."""
        return min(window, sentence_transformers_length) if sentence_transformers_length else window

    def build(self, backbone: Backbone, spec: ModelSpec) -> nn.Module:
        raise NotImplementedError

    def extra_tensors(self, spec: ModelSpec) -> dict[str, torch.Tensor]:
        """Tensors it reads from outside the checkpoint: its Dense modules' own files."""
        from engine.weights import read_checkpoint

        return {
            f"{DENSE_PREFIX}.{index}.{key}": value
            for index, layer in enumerate(self.dense)
            for key, value in read_checkpoint(layer.folder).items()
        }
