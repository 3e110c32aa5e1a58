"""sentence-transformers' Dense modules, which an embedder runs after pooling and before Normalize: each
module folder's config read into a DenseLayout, and the layer itself. The activation comes from a fixed
list of torch's; a class path from a file is never imported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.errors import UnsupportedModel

# the activations a Dense config may name (sentence-transformers saves the class's full path)
ACTIVATIONS = {
    "Tanh": nn.Tanh,
    "Identity": nn.Identity,
    "ReLU": nn.ReLU,
    "GELU": nn.GELU,
    "Sigmoid": nn.Sigmoid,
}
ACTIVATION_PREFIX = "torch.nn."
DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # sentence-transformers' default
# where a Dense module's tensors ("linear.weight", ...) go among the checkpoint's names
CHECKPOINT_PREFIX = "sentence_transformers.dense"


@dataclass(frozen=True, slots=True)
class DenseLayout:
    folder: Path  # the module's folder: config.json and its weights
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a name of ACTIVATIONS
    residual: bool  # the input added back (projected where the sizes differ)

    @classmethod
    def read(cls, folder: Path, config: dict[str, Any], name: str) -> DenseLayout:
        """`config`: the module's config.json; `name`: the model's, for errors."""
        path = config.get("activation_function") or DEFAULT_ACTIVATION
        activation = path.rsplit(".", 1)[-1]
        if not path.startswith(ACTIVATION_PREFIX) or activation not in ACTIVATIONS:
            known = ", ".join(ACTIVATIONS)
            raise UnsupportedModel(
                f"model {name!r}: Dense activation {path!r} is not supported; known: {known}"
            )
        for key, default in (
            ("module_input_name", "sentence_embedding"),
            ("module_output_name", "sentence_embedding"),
        ):
            if config.get(key, default) != default:
                raise UnsupportedModel(f"model {name!r}: a Dense module on {config[key]!r} is not supported")
        return cls(
            folder,
            int(config["in_features"]),
            int(config["out_features"]),
            bool(config.get("bias", True)),
            activation,
            bool(config.get("use_residual", False)),
        )


class Dense(nn.Module):
    """act(x W^T + b) (+ x, or its projection), on pooled rows in the model's dtype."""

    def __init__(self, layout: DenseLayout):
        super().__init__()
        self.layout = layout
        self.linear = nn.Linear(layout.in_features, layout.out_features, bias=layout.bias)
        self.act = ACTIVATIONS[layout.activation]()
        same_size = layout.in_features == layout.out_features
        self.residual = (
            nn.Linear(layout.in_features, layout.out_features, bias=False)
            if layout.residual and not same_size
            else None
        )

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        # [num_seqs, in_features] -> [num_seqs, out_features]
        out = self.act(self.linear(rows))
        if self.layout.residual:
            out = out + (rows if self.residual is None else self.residual(rows))
        return out
