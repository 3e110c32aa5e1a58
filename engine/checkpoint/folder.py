"""Checkpoint: a model folder as read before its head is chosen (its config, its sentence-transformers
files, the flags that change how it is read); read_folder reads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint.files import module_kinds, read_json, sentence_transformers_path
from engine.checkpoint.source import POOLING_FLAGS
from engine.errors import ModelNotFound, UnsupportedModel

# retrieval models whose config wraps the model posy packs (ColQwen2's Qwen2-VL, ColPali's PaliGemma): its
# inner config is the checkpoint's, the wrapper's architecture names the head
# (engine/models/late_interaction.py)
WRAPPED_CONFIGS = {"colqwen2": "vlm_config", "colpali": "vlm_config"}
# remote model types whose configuration.py subclasses a transformers config and changes nothing but its
# model_type (pplx-embed's PPLXQwen3Config of Qwen3Config): read as that config, keeping their model_type,
# with no code run
RENAMED_CONFIGS = {"bidirectional_pplx_qwen3": "qwen3"}
REMOTE_CODE = (
    "model {name!r} ships its own modeling code (auto_map in config.json): posy runs it only with "
    "--trust-remote-code, which runs the code inside the checkpoint folder"
)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    name: str  # the id the user gave
    folder: Path  # the model's folder (sentence-transformers' files)
    transformer_dir: Path  # its Transformer module's: config.json, the weights and the tokenizer
    modules: list[dict] | None  # modules.json
    hf_config: Any  # transformers.PretrainedConfig
    architecture: str  # as the config names it ("" where it names none)
    st_config: dict  # config_sentence_transformers.json
    remote_code: bool  # config.json's auto_map names modeling code in the folder
    remote_model: str  # the class its auto_map names for AutoModel ("" where none): PPLXQwen3ContextualModel
    pooling_flag: str | None  # --pooling (POOLING_FLAGS); None: the folder's own pooling

    @property
    def kinds(self) -> list[str]:
        return module_kinds(self.modules or [])

    @property
    def cross_encoder(self) -> bool:
        """A sentence-transformers CrossEncoder folder: the checkpoint scores with its own head."""
        return self.st_config.get("model_type") == "CrossEncoder"

    @property
    def runs_bare(self) -> bool:
        """sentence-transformers runs its other folders' checkpoints as the bare model."""
        return self.modules is not None and not self.cross_encoder

    @property
    def judge_module(self) -> bool:
        """A LogitScore module: any causal LM posy packs is a judge."""
        return self.cross_encoder and "LogitScore" in self.kinds


def read_folder(name: str, folder: Path, trust_remote_code: bool, pooling_flag: str | None) -> Checkpoint:
    from transformers import CONFIG_MAPPING, AutoConfig

    if pooling_flag is not None and pooling_flag not in POOLING_FLAGS:
        raise UnsupportedModel(f"--pooling must be one of {', '.join(POOLING_FLAGS)}, not {pooling_flag!r}")
    modules = read_json(folder / "modules.json")
    transformer_dir = folder / sentence_transformers_path(modules, "Transformer", default="")
    if not (transformer_dir / "config.json").is_file():
        raise ModelNotFound(f"model {name!r}: no config.json in {transformer_dir}")
    config_json = read_json(transformer_dir / "config.json") or {}
    auto_map = config_json.get("auto_map") or {}
    remote_code = bool(auto_map)
    remote_model = str(auto_map.get("AutoModel", "")).rsplit(".", 1)[-1]
    renamed = RENAMED_CONFIGS.get(config_json.get("model_type"))
    try:
        if renamed is not None:
            hf_config = CONFIG_MAPPING[renamed].from_dict(config_json)
        else:
            hf_config = AutoConfig.from_pretrained(transformer_dir, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as error:
        if remote_code and not trust_remote_code:
            raise UnsupportedModel(REMOTE_CODE.format(name=name)) from error
        raise UnsupportedModel(f"model {name!r}: cannot read its config.json: {error}") from error
    architectures = getattr(hf_config, "architectures", None) or []
    if hf_config.model_type in WRAPPED_CONFIGS:
        hf_config = getattr(hf_config, WRAPPED_CONFIGS[hf_config.model_type])
    st_config = read_json(folder / "config_sentence_transformers.json") or {}
    architecture = architectures[0] if architectures else ""
    return Checkpoint(
        name, folder, transformer_dir, modules, hf_config, architecture, st_config, remote_code, remote_model,
        pooling_flag,
    )  # fmt: skip
