"""The transformers fallback: any architecture transformers loads from the folder, behind the same step()
interface as the packed models. A packed batch is cut into length-sorted groups under a padded-token
budget, each group padded to its longest sequence and run through transformers' own class (sdpa where
the class has it, else eager); no CUDA graphs. The embedder is a Backbone under posy's own Embedder
(pooling, Dense, Normalize); a classifier is transformers' *ForSequenceClassification whole. Loading is
as strict as posy's: a tensor the checkpoint lacks fails it (transformers would fill it at random)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionMetadata
from engine.batch import PackedBatch
from engine.errors import WeightLoadError
from engine.models.backbone import Backbone
from engine.models.heads import classifier_tasks
from engine.outputs import SEQUENCE, HeadOutput

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = 512  # of a config that names no position table
PADDED_TOKENS = 16384  # a group's sequences times its longest, at most (one sequence may exceed it)
# the heads transformers' AutoModel drops when it loads a bare model from a checkpoint that has one
HEAD_SUFFIXES = ("ForMaskedLM", "ForPreTraining", "ForCausalLM", "ForSequenceClassification")
UNREAD_BY_EMBEDDERS = ("pooler.",)


def load_transformers(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    """transformers' model for the spec's task, on the device in eval mode: AutoModel for an embedder
    (its vectors pooled by posy's heads), AutoModelForSequenceClassification for a scorer."""
    import transformers

    auto = transformers.AutoModel if spec.task == "embed" else transformers.AutoModelForSequenceClassification
    model, implementation = None, "sdpa"
    for implementation in ("sdpa", "eager"):
        try:
            model, info = auto.from_pretrained(
                spec.path,
                dtype=dtype,
                attn_implementation=implementation,
                output_loading_info=True,
                trust_remote_code=spec.trust_remote_code,
            )
            break
        except ValueError as error:  # this class has no sdpa: eager
            if implementation == "eager":
                raise WeightLoadError(f"transformers cannot load {spec.name!r}: {error}") from error
    assert model is not None
    strict_check(spec, model, info)
    logger.info(
        "%s: runs through transformers' %s (%s attention)", spec.name, type(model).__name__, implementation
    )
    model.attention_implementation = implementation
    return model.to(device).eval().requires_grad_(False)


def strict_check(spec: ModelSpec, model: nn.Module, info: dict[str, Any]) -> None:
    """A tensor the model needs and the checkpoint lacks fails the load (but an embedder's pooler, which
    it never reads: a masked-LM checkpoint has none); so does one the checkpoint has and the model does
    not use, unless it belongs to a head the bare model leaves out."""
    missing = sorted(info.get("missing_keys") or [])
    if spec.task == "embed":  # an embedder reads the last hidden states, never the bare model's pooler
        missing = [name for name in missing if not name.startswith(UNREAD_BY_EMBEDDERS)]
    mismatched = sorted(str(item) for item in info.get("mismatched_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    drops_a_head = spec.architecture.endswith(HEAD_SUFFIXES) and spec.task == "embed"
    if drops_a_head and unexpected:
        logger.info("%s: the bare model leaves out %d head tensors", spec.name, len(unexpected))
        unexpected = []
    if missing or unexpected or mismatched:
        problems = [
            f"{label}: {names}"
            for label, names in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("wrong shape", mismatched),
            )
            if names
        ]
        raise WeightLoadError(f"{type(model).__name__} checkpoint does not match; " + "; ".join(problems))


def groups(lengths: list[int], budget: int = PADDED_TOKENS) -> list[list[int]]:
    """Sequence indices sorted by length, cut into groups whose count times longest stays in budget."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cut: list[list[int]] = []
    for index in order:
        if cut and (len(cut[-1]) + 1) * lengths[index] <= budget:
            cut[-1].append(index)
        else:
            cut.append([index])
    return cut


def padded_runs(batch: PackedBatch, pad_id: int):
    """(the group's sequence indices, input_ids, attention_mask, token_type_ids or None) per group, on the
    batch's device; sequences keep their order within the packed batch's rows."""
    bounds = batch.cu_seqlens.tolist()
    lengths = [end - start for start, end in zip(bounds, bounds[1:])]
    device = batch.input_ids.device
    for members in groups(lengths):
        longest = max(lengths[index] for index in members)
        input_ids = torch.full((len(members), longest), pad_id, dtype=torch.int64, device=device)
        mask = torch.zeros((len(members), longest), dtype=torch.int64, device=device)
        types = None if batch.token_type_ids is None else torch.zeros_like(input_ids)
        for row, index in enumerate(members):
            start, length = bounds[index], lengths[index]
            input_ids[row, :length] = batch.input_ids[start : start + length]
            mask[row, :length] = 1
            if types is not None:
                types[row, :length] = batch.token_type_ids[start : start + length]
        yield members, input_ids, mask, types


def model_inputs(model: nn.Module, input_ids, mask, types) -> dict[str, torch.Tensor]:
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    if types is not None and getattr(model.config, "type_vocab_size", 0):
        inputs["token_type_ids"] = types
    return inputs


class TransformersBackbone(Backbone):
    """transformers' bare model as a Backbone: its last hidden states, unpadded back into packed order."""

    def __init__(self, model: nn.Module, pad_id: int):
        super().__init__()
        self.model = model
        self.pad_id = pad_id
        self.hidden_size = model.config.hidden_size
        self.config = model.config

    @classmethod
    def window(cls, hf_config: Any, config: Any = None) -> int:
        return getattr(hf_config, "max_position_embeddings", None) or DEFAULT_WINDOW

    def encode(
        self, batch: PackedBatch, meta: AttentionMetadata, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden] (with `rows`, those rows, picked at the end:
        # transformers runs every row of every layer)
        bounds = batch.cu_seqlens.tolist()
        out = torch.empty(
            batch.input_ids.shape[0], self.hidden_size, dtype=self.model.dtype, device=batch.input_ids.device
        )
        for members, input_ids, mask, types in padded_runs(batch, self.pad_id):
            hidden = self.model(**model_inputs(self.model, input_ids, mask, types)).last_hidden_state
            for row, index in enumerate(members):
                start, end = bounds[index], bounds[index + 1]
                out[start:end] = hidden[row, : end - start]
        return out if rows is None else out[rows]

    def weight_map(self):
        return {}  # transformers loaded its own weights


class TransformersClassifier(nn.Module):
    """transformers' *ForSequenceClassification, whole: logits, one row a sequence, float32."""

    def __init__(self, model: nn.Module, pad_id: int):
        super().__init__()
        self.model = model
        self.pad_id = pad_id
        num_labels = model.config.num_labels
        self.output = HeadOutput(SEQUENCE, num_labels, classifier_tasks(num_labels))

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, num_labels] float32
        num_seqs = batch.cu_seqlens.shape[0] - 1
        out = torch.empty(num_seqs, self.model.config.num_labels, device=batch.input_ids.device)
        for members, input_ids, mask, types in padded_runs(batch, self.pad_id):
            logits = self.model(**model_inputs(self.model, input_ids, mask, types)).logits
            out[torch.tensor(members, device=out.device)] = logits.float()
        return out


def pad_id(spec: ModelSpec) -> int:
    """The id padding takes: the config's pad token, else 0 (the attention mask hides it either way)."""
    value = getattr(spec.hf_config, "pad_token_id", None)
    return int(value) if value is not None else 0
