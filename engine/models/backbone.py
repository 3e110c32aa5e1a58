"""Backbone: what every packed model family is to the heads (engine/models/heads.py) and to the engine: a
PackedBatch in, one hidden row a token out, its attention shape, and where its checkpoint's tensors go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec
    from engine.weights import WeightTargets


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """What choosing an attention backend needs to know of a model."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    window: tuple[int, int] | None = None  # of its sliding-window layers, where it has any
    position_bias: bool = False  # adds a relative position bias to its scores (MPNet)


@dataclass(frozen=True, slots=True)
class ClassifierLayout:
    """A family's sequence-classification head, by its checkpoint module names: pool, then
    [dense, activation, [LayerNorm]], then the output projection."""

    out: str
    dense: str | None = None
    activation: str = "tanh"
    dense_bias: bool = True
    norm: str | None = None
    norm_eps: float = 1e-5
    norm_bias: bool = True
    out_bias: bool = True
    pooling: str = "cls"
    skip_token: int | None = None  # "last" passes over trailing tokens of this id (a decoder's pad)
    ignored: tuple[str, ...] = ()  # checkpoint names beside the head that it does not read
    logit_offset: float = 0.0  # added to the logits (jina-reranker-m0's -2.65, its scores' sigmoid's shift)


@dataclass(frozen=True, slots=True)
class MlmLayout:
    """A family's masked-LM head, by its checkpoint module names: dense, activation, LayerNorm, then the
    decoder over the vocabulary (tied to the token embeddings unless the config unties it) and its bias,
    which some checkpoints also save under `bias_aliases`."""

    dense: str
    norm: str
    decoder: str
    bias: str
    activation: str | None = None  # None: the config's
    norm_eps: float | None = None  # None: the config's
    bias_aliases: tuple[str, ...] = ()


class Backbone(nn.Module):
    """A family's embeddings and layers. `encode` gives the hidden states of every token before
    `finish`, a row-wise closing step (the final norm, or nothing), so that a head that reads one row
    a sequence computes past the last attention, and finishes, only those rows. Checkpoint names are
    relative to the backbone, after one of `checkpoint_prefixes` (and `renamed_prefixes`);
    `ignored_weights` are skipped on purpose (a trailing "." skips everything under it) and
    `pretraining_heads` are what an embedder does not read."""

    checkpoint_prefixes: tuple[str, ...] = ()
    # (older, newer): a name that starts with the older spelling, past its prefix, is read as the newer one
    # (transformers 5's flattened SigLIP vision model beside the hub's "vision_model.")
    renamed_prefixes: tuple[tuple[str, str], ...] = ()
    ignored_weights: tuple[str, ...] = ()
    pretraining_heads: tuple[str, ...] = ()
    # the attribute names of the layers' projections that --quantization fp8 runs in FP8
    fp8_linears: tuple[str, ...] = ()
    # those of them whose input another kernel writes in FP8 in its own pass (fuse_fp8_inputs): their FP8
    # path costs the GEMM alone (engine/layers/fp8_choice.py)
    fp8_fed: tuple[str, ...] = ()
    # those of them whose activation hands the next FP8 projection its input in FP8 (Fp8Linear's
    # quantize_output_from): their FP8 path is measured with that kernel, the next one's quantization
    fp8_activated: tuple[str, ...] = ()
    # the checkpoint name of the token embedding table, which a tied LM head shares
    token_embeddings: ClassVar[str] = ""
    hidden_size: int
    # what the family's switches and the config make of the model: a variant, norms' eps, biases, ...
    config: Any

    @classmethod
    def parse(cls, hf_config: Any, architecture: str, variant: Any, causal: bool) -> Any:
        """The family's own config from transformers' (read once, with the spec; `variant`: the registry
        row's, `causal`: a decoder's mask); UnsupportedModel for a value the family cannot honour, so
        that `--model-impl auto` can run such a model through transformers instead."""
        raise NotImplementedError

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> Backbone:
        raise NotImplementedError

    @classmethod
    def attention_shape(cls, spec: ModelSpec) -> AttentionShape:
        raise NotImplementedError

    @classmethod
    def check_dtype(cls, spec: ModelSpec, dtype: torch.dtype) -> None:
        """Raise UnsupportedModel where the model does not run in this dtype (Gemma3 in float16)."""

    @classmethod
    def config_bidirectional(cls, hf_config: Any, variant: Any) -> bool:
        """The config itself makes the model bidirectional, every head of it (Gemma3's
        use_bidirectional_attention), not only an embedder asked to be."""
        return False

    @classmethod
    def window(cls, hf_config: Any, config: Any) -> int:
        """The longest sequence the model takes, special tokens included (`config`: parse's, or None)."""
        return hf_config.max_position_embeddings

    def classifier_layout(self) -> ClassifierLayout:
        raise UnsupportedModel(f"{type(self).__name__} has no sequence-classification head")

    def mlm_layout(self) -> MlmLayout:
        raise UnsupportedModel(f"{type(self).__name__} has no masked-LM head (SPLADE) in posy")

    def encode(
        self, batch: PackedBatch, meta: AttentionMetadata, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """PackedBatch of num_tokens -> [num_tokens, hidden], before `finish`; with `rows` ([n] token
        indices on the device, the rows a head reads), [n, hidden] of those rows: the last layer runs
        its attention over every token and the rest of it over these rows only."""
        raise NotImplementedError

    def finish(self, rows: torch.Tensor) -> torch.Tensor:
        # [n, hidden] -> [n, hidden], row by row
        return rows

    def fuse_fp8_inputs(self) -> None:
        """After --quantization fp8 converted the projections: have each kernel whose output feeds only an
        FP8 projection write that input in FP8 itself (a norm, an activation), so no pass of its own
        quantizes it. Families without it quantize each input in the projection."""

    def weight_map(self) -> WeightTargets:
        """Every checkpoint tensor the backbone needs -> its parameter."""
        raise NotImplementedError

    def module_targets(self, modules: dict[str, str]) -> WeightTargets:
        """checkpoint module -> our module, one entry per parameter our module has (a module built
        without a bias takes none)."""
        targets: WeightTargets = {}
        for checkpoint_name, module in modules.items():
            for leaf, _ in self.get_submodule(module).named_parameters(recurse=False):
                targets[f"{checkpoint_name}.{leaf}"] = (f"{module}.{leaf}", None)
        return targets

    def fused_targets(self, module: str, parts: dict[str, int]) -> WeightTargets:
        """Checkpoint projections (name -> output rows) that fill one fused module in their order: QKV,
        gate and up."""
        targets: WeightTargets = {}
        start = 0
        for checkpoint_name, rows in parts.items():
            for leaf, _ in self.get_submodule(module).named_parameters(recurse=False):
                targets[f"{checkpoint_name}.{leaf}"] = (f"{module}.{leaf}", slice(start, start + rows))
            start += rows
        return targets
