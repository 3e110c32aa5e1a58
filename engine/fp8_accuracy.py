"""Whether FP8 keeps a model's rows: with --quantization fp8, a probe batch of random tokens runs at start-up
with every FP8 projection in FP8 and again in the model dtype; where the rows' least cosine falls below
MIN_COSINE, FP8 is off for the whole model and the log says why in one line. One scale a token cannot keep
a row whose few channels are far larger than the rest (activation outliers), and how far the loss reaches
depends on the model, not on its shapes: random-weight Qwen2-1.5B's FP8 vectors kept a least cosine of
0.954 to bf16's on the H200, BERT-base's and Qwen3-0.6B's 0.99 and more."""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.batch import pack
from engine.layers.fp8 import fp8_layers, unquantize_linears
from engine.runner import ModelRunner

logger = logging.getLogger(__name__)

MIN_COSINE = 0.99  # what the fp8 suite holds FP8's vectors to against bf16's
PROBE_LENGTHS = (16, 64, 128, 256)  # the probe batch's sequences (random tokens of a fixed seed)


def keep_fp8_if_accurate(name: str, runner: ModelRunner, window: int) -> float | None:
    """Turn FP8 off for the runner's model (back to its dtype's layers) where its rows drift past MIN_COSINE
    on the probe batch; the least cosine, None where nothing was compared (no FP8 projection left, or rows
    of one score each, which a cosine does not judge)."""
    model = runner.model
    backbone = model.backbone
    layers = fp8_layers(backbone)
    if not layers:
        return None
    batch = pack(probe_sequences(largest_vocabulary(backbone), window))
    chosen = [layer.min_rows for layer in layers]
    try:
        fp8 = rows_with(runner, layers, [0.0] * len(layers), batch)
        plain = rows_with(runner, layers, [float("inf")] * len(layers), batch)
    finally:
        for layer, rows in zip(layers, chosen):
            layer.min_rows = rows
        backbone.fuse_fp8_inputs()
    if plain.shape[-1] < 2:
        logger.info("%s: FP8's accuracy is not checked at start-up (rows of one score)", name)
        return None
    cosine = torch.nn.functional.cosine_similarity(fp8, plain, dim=-1).min().item()
    if cosine < MIN_COSINE:
        unquantize_linears(backbone)
        backbone.fuse_fp8_inputs()
        logger.warning(
            "%s: --quantization fp8 is off: its rows drift from the model dtype's (least cosine %.4f < %.2f "
            "on a start-up probe of random tokens); the model runs in its dtype", name, cosine, MIN_COSINE,
        )  # fmt: skip
    else:
        logger.info("%s: FP8 keeps the model's rows (least cosine %.4f on a start-up probe)", name, cosine)
    return cosine


def rows_with(runner: ModelRunner, layers, min_rows: list[float], batch) -> torch.Tensor:
    for layer, rows in zip(layers, min_rows):
        layer.min_rows = rows
    runner.model.backbone.fuse_fp8_inputs()
    with torch.inference_mode():
        return runner.eager(batch).float()


def largest_vocabulary(backbone: nn.Module) -> int:
    """The token embeddings' rows (the largest embedding table: not the positions' or token types')."""
    return max(module.num_embeddings for module in backbone.modules() if isinstance(module, nn.Embedding))


def probe_sequences(vocabulary: int, window: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    lengths = [min(length, window) for length in PROBE_LENGTHS]
    return [torch.randint(0, vocabulary, (length,), generator=generator).tolist() for length in lengths]
