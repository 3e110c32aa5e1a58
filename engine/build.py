"""build_engine: model spec + engine config -> a loaded, warmed-up, running Engine."""

from __future__ import annotations

import logging

import torch

from engine.attention.backends import select_backend
from engine.batch import pack
from engine.checkpoint.spec import ModelSpec
from engine.config import EngineConfig
from engine.cuda_graphs import GraphCache
from engine.device import DTYPES
from engine.engine import BatchObserver, Engine
from engine.fp8_accuracy import keep_fp8_if_accurate, keep_fp8_if_it_pays
from engine.models.registry import spec_entry
from engine.outputs import SEQUENCE
from engine.prefixes import MIN_SAVED_TOKENS_EAGER, MIN_SAVED_TOKENS_GRAPHS
from engine.progress import progress
from engine.runner import ModelRunner
from engine.weights import load_model

logger = logging.getLogger(__name__)
FALLBACK_PROBE_LENGTH = 128


def build_engine(spec: ModelSpec, config: EngineConfig, on_batch: BatchObserver | None = None) -> Engine:
    device = torch.device(config.device)
    if device.type == "cuda" and device.index is not None:
        # the current device is per thread and starts at cuda:0: a replica on cuda:1 would load, warm
        # up and capture its graphs on the wrong one (the engine's thread sets it again)
        torch.cuda.set_device(device)
    if spec.implementation == "transformers":
        return fallback_engine(spec, config, device, on_batch)
    shape = spec_entry(spec).family.backbone.attention_shape(spec)
    backend = select_backend(
        config.attention_backend,
        device,
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype=DTYPES[config.dtype],
        window=shape.window,
        position_bias=shape.position_bias,
        graphs=config.uses_cuda_graphs,
    )
    model = load_model(
        spec, device, DTYPES[config.dtype], backend, config.quantization, config.fp8_min_rows,
        config.max_batch_tokens,
    )  # fmt: skip
    graphs = None
    if config.uses_cuda_graphs and backend.graph_safe:
        graphs = GraphCache(model, backend, config, device, max_seqlen=spec.longest_sequence)
    logger.info(
        "%s: attention backend %s (%s) on %s, %s, CUDA graphs %s",
        spec.name,
        backend.describe(),
        backend.reason,
        device,
        config.dtype,
        config.cuda_graphs if graphs is not None else "off",
    )
    runner = ModelRunner(model, device, graphs)
    if config.quantization == "fp8":  # before any graph holds FP8's kernels
        keep_fp8_if_accurate(spec.name, runner, spec.max_seq_length)
        if device.type == "cuda" and config.fp8_min_rows is None:
            keep_fp8_if_it_pays(spec.name, runner, config.max_batch_tokens, spec.max_seq_length)
    if graphs is not None and config.cuda_graphs == "eager-warmup":
        graphs.warm_up()
    # warm-up before the server says it is ready: on CUDA this compiles the Triton kernels (seconds,
    # once per machine: Triton caches them), so that no graph capture or request waits for a compile
    batches = warm_up_batches(spec.max_seq_length) if device.type == "cuda" else [[[0, 1]]]
    # on CUDA the first start of a machine compiles kernels: seconds a batch
    for sequences in progress(batches, f"{spec.name}: warming up", logger):
        runner.step(pack(sequences)).result()
    engine = Engine(runner, config, on_batch)
    seed_rate(engine, spec.max_seq_length)
    engine.attention_backend = backend.name
    # a causal model's sequences may continue a prefix they share, where the backend lays keys apart
    # (in CUDA graphs of their own too); rerank and /score send them so where it pays (engine/prefixes.py)
    causal = bool(getattr(model.backbone.config, "causal", False))
    engine.runs_prefixes = backend.reads_key_layout and causal and engine.output.rows == SEQUENCE
    engine.shares_prefixes = engine.runs_prefixes and config.shared_prefixes
    engine.min_saved_tokens = MIN_SAVED_TOKENS_EAGER if graphs is None else MIN_SAVED_TOKENS_GRAPHS
    if engine.shares_prefixes:
        logger.info(
            "%s: a rerank's pairs run their shared prefix (template and query) once a batch where that "
            "saves at least %d tokens%s", spec.name, engine.min_saved_tokens,
            " (as measured with CUDA graphs)" if graphs is not None else "",
        )  # fmt: skip
    engine.start()
    return engine


def fallback_engine(
    spec: ModelSpec, config: EngineConfig, device: torch.device, on_batch: BatchObserver | None
) -> Engine:
    """transformers' own model (engine/models/fallback.py) behind the same scheduler; no CUDA graphs."""
    model = load_model(spec, device, DTYPES[config.dtype], None, config.quantization)  # type: ignore[arg-type]
    runner = ModelRunner(model, device, None)
    runner.step(pack([[0, 1]])).result()
    engine = Engine(runner, config, on_batch)
    # short sequences: an unknown family's window may overrun its position table (served_window)
    seed_rate(engine, min(spec.max_seq_length, FALLBACK_PROBE_LENGTH))
    inner = getattr(model, "model", None) or model.backbone.model
    engine.attention_backend = f"transformers ({inner.attention_implementation})"
    logger.info(
        "%s: transformers' %s on %s, %s, CUDA graphs off",
        spec.name,
        type(inner).__name__,
        device,
        config.dtype,
    )
    engine.start()
    return engine


def seed_rate(engine: Engine, window: int) -> None:
    """Admission refuses work that cannot finish in time from the first request on, which needs a rate: a
    batch of the smallest size the rate measures, run first eagerly (and again for a CUDA graph's
    capture) and then timed as served, is its first observation; real batches soon outweigh it. Before,
    every request was admitted until a large batch had run, and a burst of them outlasted a short
    --request-timeout (504s). The idle engine times the same batch again (its probes)."""
    tokens = engine.rate.min_tokens
    lengths = [window] * (tokens // window) + ([tokens % window] if tokens % window else [])
    batch = pack([[0] * length for length in lengths])
    for _ in range(2 if engine.runner.graphs is not None else 1):  # eager (and a graph's capture)
        engine.runner.step(batch).result()
    engine.probe_batch = batch  # the idle engine's probes time it again (ServiceRate.probe_due)
    engine.probe()


def warm_up_batches(window: int) -> list[list[list[int]]]:
    """Batches that reach every kernel variant real batches use: Triton specializes a kernel on sizes
    of 1 and on sizes that divide by 16 (an eager batch may have any size, a graph's bucket always
    divides), and the packed attention tiles by length (up to 64 tokens, then up to 128)."""

    def topped_up(length: int) -> list[list[int]]:
        # one sequence of `length` tokens, then fillers (none over the window) up to a multiple of 16
        sequences, rest = [[0] * length], -length % 16
        while rest:
            sequences.append([0] * min(rest, window))
            rest -= len(sequences[-1])
        return sequences

    batches = [[[0]], [[0, 0]], topped_up(min(64, window))]
    if window > 64:
        batches.append(topped_up(min(128, window)))
    return batches
