"""Sparse lexical checkpoints: sentence-transformers SparseEncoder folders (MLMTransformer, then
SpladePooling: SPLADE) and bge-m3's extra heads (colbert_linear.pt and sparse_linear.pt beside its
sentence-transformers dense model)."""

from __future__ import annotations

from pathlib import Path

from engine.errors import UnsupportedModel
from engine.models.sparse import SpladeConfig

SPLADE_MODULES = ("MLMTransformer", "SpladePooling")
M3_FILES = ("colbert_linear.pt", "sparse_linear.pt")


def is_splade_folder(kinds: list[str]) -> bool:
    return "SpladePooling" in kinds


def read_splade(name: str, folder: Path, modules: list[dict]) -> SpladeConfig:
    from engine.spec import read_json, sentence_transformers_path

    kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
    if kinds != list(SPLADE_MODULES):
        raise UnsupportedModel(
            f"model {name!r}: sparse-encoder modules {kinds} are not supported; posy runs "
            f"{' -> '.join(SPLADE_MODULES)} (SPLADE)"
        )
    config = read_json(folder / (sentence_transformers_path(modules, "SpladePooling") or "") / "config.json")
    config = config or {}
    pooling = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise UnsupportedModel(f"model {name!r}: SpladePooling {config} is not supported")
    return SpladeConfig(pooling, activation == "log1p_relu")


def is_m3_folder(folder: Path) -> bool:
    return all((folder / file).is_file() for file in M3_FILES)
