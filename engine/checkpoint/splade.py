"""Sparse lexical checkpoints: sentence-transformers SparseEncoder folders (a masked LM's logits, then
SpladePooling: SPLADE), a bare masked LM served as SPLADE when asked (--pooling splade), and bge-m3's extra
heads (colbert_linear.pt and sparse_linear.pt beside its sentence-transformers dense model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint.files import read_json, sentence_transformers_path
from engine.errors import UnsupportedModel


@dataclass(frozen=True, slots=True)
class SpladeConfig:
    pooling: str  # "max" | "sum"
    log_twice: bool  # "log1p_relu": log(1 + log(1 + relu(x)))


# the module lists that are SPLADE: sentence-transformers 5's MLMTransformer, or 6's Transformer loaded for
# its masked-LM logits (TRANSFORMER_TASK), then SpladePooling
SPLADE_MODULES = (("MLMTransformer", "SpladePooling"), ("Transformer", "SpladePooling"))
TRANSFORMER_TASK = "fill-mask"
# what SparseEncoder(folder) pools a bare *ForMaskedLM folder with: SpladePooling's defaults
BARE_SPLADE = SpladeConfig("max", log_twice=False)
SPLADE_POOLINGS = ("max", "sum")
SPLADE_ACTIVATIONS = {"relu": False, "log1p_relu": True}  # -> SpladeConfig.log_twice
M3_FILES = ("colbert_linear.pt", "sparse_linear.pt")


def is_splade_folder(kinds: list[str]) -> bool:
    return "SpladePooling" in kinds


def read_splade(name: str, folder: Path, modules: list[dict]) -> SpladeConfig:
    kinds = tuple(module["type"].rsplit(".", 1)[-1] for module in modules)
    if kinds not in SPLADE_MODULES:
        layouts = " or ".join(" -> ".join(layout) for layout in SPLADE_MODULES)
        raise UnsupportedModel(
            f"model {name!r}: sparse-encoder modules {list(kinds)} are not supported; posy runs {layouts} "
            "(SPLADE)"
        )
    if kinds[0] == "Transformer":
        transformer = folder / (sentence_transformers_path(modules, "Transformer") or "")
        task = (read_json(transformer / "sentence_bert_config.json") or {}).get("transformer_task")
        if task != TRANSFORMER_TASK:
            raise UnsupportedModel(
                f"model {name!r}: its Transformer module is loaded for {task or 'feature-extraction'!r}; "
                f"SpladePooling pools the vocabulary logits of one loaded for {TRANSFORMER_TASK!r}"
            )
    config = read_json(folder / (sentence_transformers_path(modules, "SpladePooling") or "") / "config.json")
    config = config or {}
    pooling = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if pooling not in SPLADE_POOLINGS or activation not in SPLADE_ACTIVATIONS:
        raise UnsupportedModel(
            f"model {name!r}: SpladePooling {config} is not supported; posy runs pooling_strategy "
            f"{' or '.join(SPLADE_POOLINGS)} with activation_function {' or '.join(SPLADE_ACTIVATIONS)}"
        )
    return SpladeConfig(pooling, SPLADE_ACTIVATIONS[activation])


def bare_splade(name: str, architecture: str, modules: list[dict] | None) -> SpladeConfig:
    """--pooling splade on a folder without SpladePooling: a masked LM's own folder, pooled as
    SparseEncoder(folder) pools it."""
    if modules is not None or not architecture.endswith("ForMaskedLM"):
        what = "sentence-transformers modules without SpladePooling" if modules is not None else architecture
        raise UnsupportedModel(
            f"model {name!r}: --pooling splade runs a *ForMaskedLM checkpoint (or a SparseEncoder folder), "
            f"not {what or 'a checkpoint that names no architecture'}"
        )
    return BARE_SPLADE


def is_m3_folder(folder: Path) -> bool:
    return all((folder / file).is_file() for file in M3_FILES)
