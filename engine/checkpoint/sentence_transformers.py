"""A sentence-transformers embedder's modules after its Transformer: Pooling, Dense, Normalize and a
quantizer, read into the pooling, the normalization and the Dense layouts posy's Embedder runs, and the
quantization the gateway makes of its vectors."""

from __future__ import annotations

from pathlib import Path

from engine.checkpoint.files import read_json, sentence_transformers_path
from engine.errors import UnsupportedModel
from engine.models.dense import DenseLayout

ST_POOLING_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
# the sentence-transformers modules an embedder runs, in the order it runs them
ST_MODULE_ORDER = ("Transformer", "Pooling", "Dense", "Normalize", "Quantizer")
# quantizer modules of a checkpoint's own code (modules.json's type), whose arithmetic posy does itself (the
# code is never imported) -> the quantization it makes of the raw vector (api/quantize.py): pplx-embed's
# st_quantize.FlexibleQuantizer gives int8 = round(127 tanh(x)) and binary = (x >= 0)
QUANTIZER_MODULES = {"st_quantize.FlexibleQuantizer": "tanh"}
ST_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def sentence_transformers_pooling(
    name: str, folder: Path, modules: list[dict]
) -> tuple[str, bool, tuple[DenseLayout, ...]]:
    """(pooling, normalize, the Dense modules after pooling) from the sentence-transformers files: the
    modules Transformer, Pooling, any Dense, then Normalize if listed, in that order."""
    kinds = [module_kind(module) for module in modules]
    unsupported = [kind for kind in kinds if kind not in ST_MODULE_ORDER]
    if unsupported:
        raise UnsupportedModel(f"model {name!r}: sentence-transformers modules {unsupported} are unsupported")
    ranks = [ST_MODULE_ORDER.index(kind) for kind in kinds]
    if ranks != sorted(ranks):
        raise UnsupportedModel(
            f"model {name!r}: sentence-transformers modules in the order {kinds} are unsupported"
        )
    pooling_path = sentence_transformers_path(modules, "Pooling")
    config = read_json(folder / pooling_path / "config.json") if pooling_path is not None else None
    if config is None:
        raise UnsupportedModel(f"model {name!r}: modules.json lists no readable Pooling config")
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [mode for key, mode in ST_LEGACY_POOLING_KEYS.items() if config.get(key)]
        mode = modes if len(modes) != 1 else modes[0]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if not isinstance(mode, str) or mode not in ST_POOLING_MODES or config.get("include_prompt") is False:
        raise UnsupportedModel(f"model {name!r}: sentence-transformers pooling {config} is not supported")
    return ST_POOLING_MODES[mode], "Normalize" in kinds, dense_layouts(name, folder, modules)


def dense_layouts(name: str, folder: Path, modules: list[dict]) -> tuple[DenseLayout, ...]:
    """The Dense modules of a sentence-transformers folder, in order."""
    dense = []
    for module in modules:
        if module["type"].rsplit(".", 1)[-1] == "Dense":
            dense_folder = folder / module.get("path", "")
            dense_config = read_json(dense_folder / "config.json")
            if dense_config is None:
                raise UnsupportedModel(
                    f"model {name!r}: no config.json in its Dense module {module.get('path')!r}"
                )
            dense.append(DenseLayout.read(dense_folder, dense_config, name))
    return tuple(dense)


def module_kind(module: dict) -> str:
    """A module's kind ("Pooling", ...); "Quantizer" for one of QUANTIZER_MODULES."""
    return "Quantizer" if module["type"] in QUANTIZER_MODULES else module["type"].rsplit(".", 1)[-1]


def native_quantization(modules: list[dict] | None) -> str | None:
    """The quantization an embedder's own quantizer module makes of its vectors (QUANTIZER_MODULES); None
    where it has none."""
    for module in modules or []:
        if module["type"] in QUANTIZER_MODULES:
            return QUANTIZER_MODULES[module["type"]]
    return None
