"""Build a ModelSpec's model and load its weights: the checkpoint's tensors through the model's name map,
strictly (any missing or unexpected tensor fails the load); the transformers fallback; --quantization."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from engine.attention import AttentionBackend, select_backend
from engine.checkpoint.files import read_json
from engine.checkpoint.spec import ModelSpec
from engine.config import GPU_MAX_BATCH_TOKENS, QUANTIZATIONS
from engine.errors import QuantizationUnavailable, WeightLoadError
from engine.layers.fp8 import NEVER, check_fp8, fp8_layers, quantize_linears, unquantize_linears
from engine.layers.fp8_choice import choose_fp8_rows
from engine.layers.pooling import Pooler
from engine.models.heads import Embedder
from engine.models.registry import build_model, spec_entry
from engine.progress import progress

logger = logging.getLogger(__name__)

# where one checkpoint tensor goes: (parameter name, rows of the parameter it fills or None for all,
# and optionally the rows of the tensor that are read, e.g. a reranker's two rows of an LM head)
WeightTarget = tuple[str, slice | None] | tuple[str, slice | None, tuple[int, ...]]
# checkpoint name -> one target, or several (a tied embedding table that also gives a head its rows)
WeightTargets = dict[str, WeightTarget | list[WeightTarget]]
# what older checkpoints (TF-era BERT uploads, SPLADE's among them) call a LayerNorm's parameters, renamed
# as transformers renames them on load; the rest of the strict check is unchanged
LEGACY_NAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
# the random fills that modules' constructors run, skipped on the meta device (Unfilled)
RANDOM_FILLS = (nn.init.normal_, nn.init.trunc_normal_, nn.init.uniform_, nn.init.kaiming_uniform_,
                nn.init.xavier_uniform_)  # fmt: skip


class Unfilled(TorchFunctionMode):
    """Modules built inside (on the meta device, every parameter to come from the checkpoint) skip their
    random fills: a meta tensor's normal_ (an nn.Embedding's) imports torch._dynamo, about 2 s of every
    start-up."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in RANDOM_FILLS:  # the tensor, filled in place, is what each returns
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def load_model(
    spec: ModelSpec,
    device: torch.device | str,
    dtype: torch.dtype,
    attention_backend: AttentionBackend,
    quantization: str = "none",
    fp8_min_rows: int | None = None,
    max_rows: int = GPU_MAX_BATCH_TOKENS,
) -> nn.Module:
    """Build the model on the device in eval mode; every parameter comes from the checkpoint. With
    `quantization` "fp8", the backbone's projections then run in FP8 (engine/layers/fp8.py) for inputs of
    `fp8_min_rows` rows or more; None: from where it pays on CUDA, measured per shape up to `max_rows`
    (engine/layers/fp8_choice.py), and always on the CPU, where FP8 is emulated for checking accuracy."""
    if quantization not in QUANTIZATIONS:
        raise QuantizationUnavailable(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
    if spec.implementation == "transformers":
        if quantization != "none":
            raise QuantizationUnavailable(
                f"model {spec.name!r}: --quantization {quantization} runs on the families posy packs, not "
                "through transformers"
            )
        return load_fallback(spec, device, dtype)
    spec_entry(spec).family.backbone.check_dtype(spec, dtype)
    with torch.device("meta"), Unfilled():
        model = build_model(spec, attention_backend)
    # every parameter is overwritten by load_weights, which fails on any it does not fill
    materialize(model, dtype, device)
    started = time.perf_counter()
    tensors = {**read_checkpoint(spec.path), **spec.head.extra_tensors(spec)}
    load_weights(model, tensors)
    for part in (getattr(model, "backbone", None), model):
        # what a backbone or head derives from what it read (a vision tower's pixel normalization, a
        # vocabulary padded for aligned GEMMs)
        if hasattr(part, "after_load"):
            part.after_load()
    size_gb = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values()) / 1e9
    logger.info(
        "%s: loaded %d checkpoint tensors (%.2f GB) onto %s in %.1f s",
        spec.name, len(tensors), size_gb, device, time.perf_counter() - started,
    )  # fmt: skip
    if quantization == "fp8":
        check_fp8(torch.device(device))
        backbone = model.backbone
        count = quantize_linears(backbone, backbone.fp8_linears)
        if count == 0:
            raise QuantizationUnavailable(f"model {spec.name!r}: no projection of it runs in FP8")
        settle_fp8_rows(spec, backbone, torch.device(device), fp8_min_rows, max_rows)
    return model.eval().requires_grad_(False)


def materialize(model: nn.Module, dtype: torch.dtype, device: torch.device | str) -> None:
    """Each meta parameter and buffer of `model` made an uninitialized tensor on `device`, floating ones in
    `dtype` (a tied one stays tied): nn.Module.to and to_empty would run meta tensors through torch's
    reference ops, which import its symbolic shapes (about 0.9 s of every start-up)."""
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id of a meta tensor -> (it, its real one)

    def real(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in made:
            kind = dtype if tensor.is_floating_point() else tensor.dtype
            empty = torch.empty(tensor.shape, dtype=kind, device=device)
            if isinstance(tensor, nn.Parameter):
                empty = nn.Parameter(empty, requires_grad=tensor.requires_grad)
            made[id(tensor)] = (tensor, empty)
        return made[id(tensor)][1]

    for module in model.modules():
        for tensors in (module._parameters, module._buffers):
            for name, tensor in tensors.items():
                if tensor is not None:
                    tensors[name] = real(tensor)


def settle_fp8_rows(
    spec: ModelSpec, backbone: nn.Module, device: torch.device, min_rows: int | None, max_rows: int
) -> None:
    """Set the rows from which each FP8 projection runs in FP8 (load_model's `fp8_min_rows`), and its
    producers' FP8 outputs to match; where none pays at any size, the projections go back to the model
    dtype."""
    layers = fp8_layers(backbone)
    if min_rows is not None or device.type != "cuda":
        for layer in layers:
            layer.min_rows = min_rows or 0
        backbone.fuse_fp8_inputs()
        logger.info(
            "%s: %d projections run in FP8 (weights per channel, inputs per token) from %d rows",
            spec.name, len(layers), min_rows or 0,
        )  # fmt: skip
        return
    chosen = choose_fp8_rows(backbone, max_rows)
    backbone.fuse_fp8_inputs()  # (which may hold a projection to its producer's rows)
    if all(layer.min_rows == NEVER for layer in layers):
        unquantize_linears(backbone)
        backbone.fuse_fp8_inputs()
        logger.warning(
            "%s: --quantization fp8 is faster at no batch size up to %d tokens on this GPU (measured: %s): "
            "the model runs in its dtype", spec.name, max_rows, measured(chosen, max_rows),
        )  # fmt: skip
        return
    logger.info(
        "%s: %d projections run in FP8 (weights per channel, inputs per token) where it is faster, as "
        "measured: %s", spec.name, len(layers), measured(chosen, max_rows),
    )  # fmt: skip


def measured(chosen: dict[str, tuple[float, float]], max_rows: int) -> str:
    """choose_fp8_rows' outcome for the log: each shape's first FP8 size and its gain at the largest."""
    return "; ".join(
        f"{shape} {speedup:.2f}x the model dtype at {max_rows} rows, "
        + ("never in FP8" if rows == NEVER else f"FP8 from {rows:.0f} rows")
        for shape, (rows, speedup) in chosen.items()
    )


def check_checkpoint(spec: ModelSpec, dtype: torch.dtype) -> None:
    """Raise where load_model would refuse the checkpoint (its dtype, its tensors), from the tensors' names
    and shapes alone (safetensors headers; the model on the meta device), so that it fails before anything
    loads or starts. The transformers fallback checks its own at load."""
    if spec.implementation == "transformers":
        return
    spec_entry(spec).family.backbone.check_dtype(spec, dtype)
    with torch.device("meta"), Unfilled():
        model = build_model(spec, select_backend("torch", "cpu"))
    dense = {name: tensor.shape for name, tensor in spec.head.extra_tensors(spec).items()}
    match_weights(model, {**checkpoint_shapes(spec.path), **dense})


def load_fallback(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    """transformers' model for the spec (engine/models/fallback.py); an embedder's Dense modules are
    posy's, loaded as strictly as a packed model's."""
    from engine.models.fallback import TransformersBackbone, TransformersClassifier, load_transformers, pad_id

    model = load_transformers(spec, device, dtype)
    if spec.task != "embed":
        return TransformersClassifier(model, pad_id(spec))
    embedder = Embedder(
        TransformersBackbone(model, pad_id(spec)), Pooler(spec.pooling, spec.normalize), spec.dense
    )
    embedder.dense.to(device=device, dtype=dtype)
    load_weights(embedder, spec.head.extra_tensors(spec))
    return embedder.eval().requires_grad_(False)


def read_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint: model.safetensors, its sharded index, or pytorch_model.bin."""
    from safetensors.torch import load_file

    files, tensors = checkpoint_files(folder), {}
    # a large model's shards take a while each: say how far loading has come
    shown = progress(files, f"reading {folder.name}'s weight shards", logger) if len(files) > 1 else files
    for file in shown:
        tensors.update(load_file(file) if file.suffix == ".safetensors" else load_pickle(file))
    return tensors


def checkpoint_shapes(folder: Path) -> dict[str, Sequence[int]]:
    """Every tensor's shape, as read_checkpoint would read it, from safetensors headers (a pickle is mapped,
    not read, where its format allows)."""
    from safetensors import safe_open

    shapes: dict[str, Sequence[int]] = {}
    for file in checkpoint_files(folder):
        if file.suffix == ".safetensors":
            with safe_open(file, framework="pt") as tensors:
                shapes.update({name: tensors.get_slice(name).get_shape() for name in tensors.keys()})  # noqa: SIM118
            continue
        try:
            pickled = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # a pickle of the format before torch 1.6, which cannot be mapped
            pickled = load_pickle(file)
        shapes.update({name: tensor.shape for name, tensor in pickled.items()})
    return shapes


def checkpoint_files(folder: Path) -> list[Path]:
    """A checkpoint's weight files: the shards its index names, model.safetensors, or pytorch_model.bin."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = read_json(folder / index_name)
        if index is not None:
            return [folder / shard for shard in sorted(set(index["weight_map"].values()))]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    raise WeightLoadError(f"no weights in {folder} (model.safetensors, an index, or pytorch_model.bin)")


def load_pickle(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_weights(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy checkpoint tensors into the model through its name map; fail on any gap or surplus."""
    matched = match_weights(model, {name: tensor.shape for name, tensor in tensors.items()})
    params = dict(model.named_parameters())
    with torch.no_grad():
        for checkpoint_name, tensor in progress(list(tensors.items()), "copying weights", logger):
            for param_name, rows, *source_rows in matched.get(checkpoint_name, ()):
                destination = params[param_name] if rows is None else params[param_name][rows]
                destination.copy_(tensor[list(source_rows[0])] if source_rows else tensor)


def match_weights(model: nn.Module, shapes: Mapping[str, Sequence[int]]) -> dict[str, list[WeightTarget]]:
    """Each checkpoint tensor (by name and shape) -> where it goes, through the model's name map (ignored
    ones left out); WeightLoadError on any missing, unexpected or misshapen tensor. Shapes only, so that a
    model on the meta device checks a checkpoint whose tensors are not read (check_checkpoint)."""
    targets = model.weight_map()
    params = dict(model.named_parameters())
    ignored = tuple(model.ignored_weights)
    ignored_prefixes = tuple(prefix for prefix in ignored if prefix.endswith("."))
    missing = set(targets)
    matched: dict[str, list[WeightTarget]] = {}
    unexpected, misshapen = [], []
    for checkpoint_name, shape in shapes.items():
        name = strip_prefix(modern_name(checkpoint_name), model.checkpoint_prefixes)
        for older, newer in getattr(model, "renamed_prefixes", ()):
            if name.startswith(older):
                name = newer + name.removeprefix(older)
        if name in ignored or name.startswith(ignored_prefixes):
            continue
        if name not in missing:  # unknown, or given twice (with and without a prefix, or a legacy name)
            unexpected.append(checkpoint_name)
            continue
        missing.discard(name)
        given = targets[name]
        matched[checkpoint_name] = given if isinstance(given, list) else [given]
        for param_name, rows, *source_rows in matched[checkpoint_name]:
            expected = tuple(params[param_name].shape if rows is None else params[param_name][rows].shape)
            source = (len(source_rows[0]), *shape[1:]) if source_rows else tuple(shape)
            if expected != source:
                misshapen.append(f"{checkpoint_name} {source} != {expected}")
    if missing or unexpected or misshapen:
        problems = [
            f"{label}: {sorted(names)}"
            for label, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshapen))
            if names
        ]
        raise WeightLoadError(f"{type(model).__name__} checkpoint does not match; " + "; ".join(problems))
    return matched


def modern_name(name: str) -> str:
    for legacy, modern in LEGACY_NAMES.items():
        if name.endswith(legacy):
            return name.removesuffix(legacy) + modern
    return name


def strip_prefix(name: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name
