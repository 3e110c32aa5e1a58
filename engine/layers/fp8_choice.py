"""Which inputs run in FP8: for each projection shape of a model, the rows from which its FP8 GEMM (with
its input's quantization and its activation) takes less GPU time than the model dtype's layer, measured on
the device at start-up. Small batches are launch- and latency-bound and never gain (on the H200: a batch of
one 128-token text 1.42 ms in FP8 against 1.20 in bf16); where no size up to the largest batch gains, the
projection stays in the model dtype."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from engine.layers.fp8 import NEVER, Fp8Linear, quantize_rows

MIN_ROWS = 16  # the least size measured
REPEATS = 10  # timed runs of each size and kind, back to back
# FP8 takes a size where it is at least this much faster: a tie keeps the exact path
MARGIN = 0.03
# GPU cycles the stream sleeps before the timed runs, so that they are queued before the first starts and
# the events time the kernels, not their launches (under CUDA graphs launches cost next to nothing)
QUEUE_AHEAD_CYCLES = 4_000_000

# a timing: (rows, the model dtype's seconds, FP8's seconds)
Timing = tuple[int, float, float]


def choose_fp8_rows(backbone: nn.Module, max_rows: int) -> dict[str, tuple[float, float]]:
    """Set each Fp8Linear's min_rows under `backbone` by measuring its shape on its device, once a shape
    (its sizes, activation, bias, whether a producer writes its input in FP8: the backbone's `fp8_fed`,
    whose FP8 path is the GEMM alone, and whether it writes the next one's: `fp8_activated`); returns
    (min_rows, FP8's speedup at max_rows) by shape ("768x3072 gelu +bias": (2048.0, 1.21))."""
    chosen: dict[str, tuple[float, float]] = {}
    sizes = row_sizes(max_rows)
    fed_names = getattr(backbone, "fp8_fed", ())
    activated_names = getattr(backbone, "fp8_activated", ())
    for parent in backbone.modules():
        for name, layer in parent.named_children():
            if not isinstance(layer, Fp8Linear):
                continue
            fed, activated = name in fed_names, name in activated_names
            shape = shape_of(layer, fed, activated)
            if shape not in chosen:
                timings = measure(layer, sizes, fed, activated)
                _, plain, fp8 = timings[-1]
                chosen[shape] = pays_from(timings), plain / fp8
            layer.min_rows = chosen[shape][0]
    return chosen


def shape_of(layer: Fp8Linear, fed: bool = False, activated: bool = False) -> str:
    activation = f" {layer.activation}" if layer.activation else ""
    extras = f"{'' if layer.bias is None else ' +bias'}{' fed fp8' if fed else ''}"
    return f"{layer.in_features}x{layer.out_features}{activation}{extras}{' to fp8' if activated else ''}"


def row_sizes(max_rows: int) -> list[int]:
    """Powers of two from MIN_ROWS, and max_rows itself."""
    sizes, size = [], MIN_ROWS
    while size < max_rows:
        sizes.append(size)
        size *= 2
    return [*sizes, max_rows]


def pays_from(timings: Sequence[Timing]) -> float:
    """The least size from which FP8 is faster by MARGIN at it and at every larger size; NEVER where it is
    not at the largest."""
    start = NEVER
    for rows, plain, fp8 in sorted(timings, reverse=True):
        if fp8 > plain * (1.0 - MARGIN):
            break
        start = rows
    return start


def measure(
    layer: Fp8Linear, sizes: Sequence[int], fed: bool = False, activated: bool = False
) -> list[Timing]:
    """(rows, the model dtype's seconds, FP8's seconds) of the layer at each size, on its device; `fed`:
    its FP8 input comes quantized (by its producer, whose pass runs in either dtype); `activated`: its FP8
    path ends in the kernel that activates and quantizes its output for the next projection (which the
    model dtype's path leaves to that projection)."""
    weight = layer.linear.weight
    saved = layer.min_rows, layer.quantize_output_from
    layer.min_rows, layer.quantize_output_from = 0, 0 if activated else NEVER
    try:
        timings = []
        for rows in sizes:
            x = torch.randn(rows, layer.in_features, device=weight.device, dtype=weight.dtype)
            quantized = quantize_rows(x) if fed else None
            fp8 = gpu_seconds(lambda x, fed_x=quantized: layer(fed_x if fed_x is not None else x), x)
            timings.append((rows, gpu_seconds(layer.linear, x), fp8))
        return timings
    finally:
        layer.min_rows, layer.quantize_output_from = saved


@torch.inference_mode()
def gpu_seconds(run: Callable[[torch.Tensor], object], x: torch.Tensor) -> float:
    """The GPU time of one run(x), over REPEATS runs queued behind a sleep."""
    run(x)  # first use: a kernel's compile, cuBLAS's choice of algorithm
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
    start.record()
    for _ in range(REPEATS):
        run(x)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / REPEATS
