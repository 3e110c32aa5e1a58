"""build_engine: model spec + engine config -> a loaded, warmed-up, running Engine."""

from __future__ import annotations

import logging

import torch

from engine.attention.backends import select_backend
from engine.batch import pack
from engine.config import EngineConfig
from engine.cuda_graphs import GraphCache
from engine.device import DTYPES
from engine.engine import BatchObserver, Engine
from engine.loader import ModelSpec, load_model
from engine.runner import ModelRunner

logger = logging.getLogger(__name__)


def build_engine(spec: ModelSpec, config: EngineConfig, on_batch: BatchObserver | None = None) -> Engine:
    device = torch.device(config.device)
    hf_config = spec.hf_config
    num_heads = hf_config.num_attention_heads
    backend = select_backend(
        config.attention_backend,
        device,
        num_heads=num_heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
        dtype=DTYPES[config.dtype],
        graphs=config.uses_cuda_graphs,
    )
    model = load_model(spec, device, DTYPES[config.dtype], backend)
    graphs = None
    if config.uses_cuda_graphs and backend.graph_safe:
        graphs = GraphCache(model, config, device, max_seqlen=spec.max_seq_length)
    logger.info(
        "%s: attention backend %s (%s) on %s, %s, CUDA graphs %s",
        spec.name,
        backend.name,
        backend.reason,
        device,
        config.dtype,
        config.cuda_graphs if graphs is not None else "off",
    )
    runner = ModelRunner(model, device, graphs)
    if graphs is not None and config.cuda_graphs == "eager-warmup":
        graphs.warm_up()
    # warm-up: one short sequence through the whole model before the server says it is ready; on
    # CUDA this compiles the Triton kernels (seconds, once per machine: Triton caches them)
    logger.info("%s: warming up", spec.name)
    runner.step(pack([[0, 1]])).result()
    engine = Engine(runner, config, on_batch)
    engine.start()
    return engine
