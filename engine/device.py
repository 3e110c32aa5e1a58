"""Resolves "auto" device and dtype choices once at start-up."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"unknown device '{name}': use auto, cpu or cuda[:N]")
    return name


def resolve_dtype(name: str, device: str) -> str:
    if name == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    if name not in DTYPES:
        raise ValueError(f"unknown dtype '{name}': use auto, {', '.join(DTYPES)}")
    return name
