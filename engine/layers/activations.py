"""Activation functions by the names HF configs give in `hidden_act`."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from engine.errors import UnsupportedModel
from engine.layers.quick_gelu import QuickGELU

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "gelu_fast": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "tanh": nn.Tanh,
    "quick_gelu": QuickGELU,  # CLIP's
}


def get_activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise UnsupportedModel(f"unsupported activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]()
