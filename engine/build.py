"""build_engine: model spec + engine config -> a loaded, warmed-up, running Engine."""

from __future__ import annotations

import logging

import torch

from engine.attention.backends import select_backend
from engine.batch import pack
from engine.config import EngineConfig
from engine.device import DTYPES
from engine.engine import BatchObserver, Engine
from engine.loader import ModelSpec, load_model
from engine.runner import ModelRunner

logger = logging.getLogger(__name__)


def build_engine(spec: ModelSpec, config: EngineConfig, on_batch: BatchObserver | None = None) -> Engine:
    device = torch.device(config.device)
    backend = select_backend(config.attention_backend, device)
    logger.info("%s: attention backend %s on %s, %s", spec.name, backend.name, device, config.dtype)
    model = load_model(spec, device, DTYPES[config.dtype], backend)
    runner = ModelRunner(model, device)
    # warm-up: one short sequence through the whole model before the server says it is ready
    runner.step(pack([[0, 1]])).result()
    engine = Engine(runner, config, on_batch)
    engine.start()
    return engine
