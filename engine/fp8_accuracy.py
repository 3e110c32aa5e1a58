"""Whether FP8 keeps a model's rows: with --quantization fp8, a probe batch of random tokens runs at start-up
with every FP8 projection in FP8 and again in the model dtype; where the rows' least cosine falls below
MIN_COSINE, FP8 is off for the whole model and the log says why in one line. One scale a token cannot keep
a row whose few channels are far larger than the rest (activation outliers), and how far the loss reaches
depends on the model, not on its shapes: random-weight Qwen2-1.5B's FP8 vectors kept a least cosine of
0.954 to bf16's on the H200, BERT-base's and Qwen3-0.6B's 0.99 and more.
And whether FP8 pays for that loss: on the GPU, a full batch runs in FP8 and in the model dtype, and where
the whole model gains less than MIN_MODEL_GAIN, FP8 is off too, its reason in one line."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from engine.batch import PackedBatch, pack
from engine.layers.fp8 import fp8_layers, unquantize_linears
from engine.runner import ModelRunner

logger = logging.getLogger(__name__)

MIN_COSINE = 0.99  # what the fp8 suite holds FP8's vectors to against bf16's
PROBE_LENGTHS = (16, 64, 128, 256)  # the probe batch's sequences (random tokens of a fixed seed)
# FP8 costs accuracy (rows within MIN_COSINE, not the model dtype's 0.9999): it stays on only where a full
# batch of the whole model runs at least this much faster. On an H100 the projections' own gains left
# XLM-R large's 50 x 512-token scoring 1.08x faster (attention and norms keep their time) and Qwen3-
# Reranker-0.6B's 1.13x. An engine given its FP8 rows (EngineConfig.fp8_min_rows) is not judged
MIN_MODEL_GAIN = 1.2
GAIN_SEQUENCE_TOKENS = 512  # the gain's batch: sequences of this length (or the window's), a full batch
GAIN_REPEATS = 3


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
        use_rows(runner, layers, chosen)
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


def keep_fp8_if_it_pays(
    name: str, runner: ModelRunner, max_batch_tokens: int, window: int, seconds: StepSeconds | None = None
) -> float | None:
    """Turn FP8 off for the runner's model where a full batch (max_batch_tokens of random tokens) runs less
    than MIN_MODEL_GAIN times faster with its projections in FP8, from the rows chosen for each, than in the
    model dtype; its gain, None where no FP8 projection is left. `seconds`: what times a batch (the GPU's
    time of eager runs; tests give their own)."""
    backbone = runner.model.backbone
    layers = fp8_layers(backbone)
    if not layers:
        return None
    length = min(GAIN_SEQUENCE_TOKENS, window)
    lengths = [length] * max(1, max_batch_tokens // length)
    batch = pack(random_sequences(largest_vocabulary(backbone), lengths, seed=1))
    seconds = seconds or gpu_step_seconds
    chosen = [layer.min_rows for layer in layers]
    try:
        fp8_s = seconds(runner, layers, chosen, batch)
        plain_s = seconds(runner, layers, [float("inf")] * len(layers), batch)
    finally:
        use_rows(runner, layers, chosen)
    gain = plain_s / fp8_s
    tokens = batch.num_tokens
    if gain < MIN_MODEL_GAIN:
        unquantize_linears(backbone)
        backbone.fuse_fp8_inputs()
        logger.warning(
            "%s: --quantization fp8 is off: a full batch (%d tokens) runs only %.2fx faster in FP8 than in "
            "the model dtype on this GPU (%.1f against %.1f ms), under the %.1fx that pays for FP8's loss of "
            "accuracy; the model runs in its dtype",
            name, tokens, gain, 1e3 * fp8_s, 1e3 * plain_s, MIN_MODEL_GAIN,
        )  # fmt: skip
    else:
        logger.info(
            "%s: FP8 runs a full batch (%d tokens) %.2fx faster than the model dtype (%.1f against %.1f ms)",
            name, tokens, gain, 1e3 * fp8_s, 1e3 * plain_s,
        )  # fmt: skip
    return gain


# (runner, FP8 layers, each layer's min_rows, batch) -> seconds a run of the batch takes
StepSeconds = Callable[[ModelRunner, list, list[float], PackedBatch], float]


def gpu_step_seconds(runner: ModelRunner, layers, min_rows: list[float], batch: PackedBatch) -> float:
    """The GPU time of an eager run of `batch` with these min_rows: the least of GAIN_REPEATS, after one."""
    use_rows(runner, layers, min_rows)
    times = []
    with torch.inference_mode():
        runner.eager(batch)
        for _ in range(GAIN_REPEATS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runner.eager(batch)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    return min(times)


def use_rows(runner: ModelRunner, layers, min_rows: list[float]) -> None:
    """Each FP8 layer from its given rows on, and its producers' FP8 outputs to match."""
    for layer, rows in zip(layers, min_rows):
        layer.min_rows = rows
    runner.model.backbone.fuse_fp8_inputs()


def rows_with(runner: ModelRunner, layers, min_rows: list[float], batch) -> torch.Tensor:
    use_rows(runner, layers, min_rows)
    with torch.inference_mode():
        return runner.eager(batch).float()


def largest_vocabulary(backbone: nn.Module) -> int:
    """The token embeddings' rows (the largest embedding table: not the positions' or token types')."""
    return max(module.num_embeddings for module in backbone.modules() if isinstance(module, nn.Embedding))


def probe_sequences(vocabulary: int, window: int) -> list[list[int]]:
    return random_sequences(vocabulary, [min(length, window) for length in PROBE_LENGTHS], seed=0)


def random_sequences(vocabulary: int, lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocabulary, (length,), generator=generator).tolist() for length in lengths]
