"""Where FP8 drifts from the model dtype, layer by layer: `python -m benchmarks.fp8_drift [shape]` builds
a random-weight checkpoint of a layout (benchmarks/layouts.py; Qwen2-1.5B by default, whose FP8 vectors
kept a min cosine of 0.954 to bf16's in the fp8 suite), runs the fp8 suite's mixed sequences through it
in bf16 and in FP8 from every size, with posy's fused quantizing kernels and with torch's ops alone, and
prints each layer's residual stream's cosine to bf16's (the worst token and the mean) and its largest
magnitude; and the fused gated-product kernel against torch's ops at the layout's intermediate width.
`--smoke`: tiny shapes on the CPU (FP8 emulated, no fused kernels)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from pathlib import Path

from benchmarks.layouts import GEMMA3, QWEN2, save_layout
from benchmarks.mixed import mixed_sequences

LAYOUTS = {layout.name: layout for layout in (QWEN2, GEMMA3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fp8_drift")
    parser.add_argument("layout", nargs="?", default="qwen2", choices=sorted(LAYOUTS))
    parser.add_argument("--texts", type=int, default=100)
    parser.add_argument("--smoke", action="store_true")
    options = parser.parse_args(argv)
    import torch

    device = "cpu" if options.smoke else "cuda"
    dtype = torch.float32 if options.smoke else torch.bfloat16
    with tempfile.TemporaryDirectory() as folder:
        layout = LAYOUTS[options.layout]
        shape = "smoke" if options.smoke else next(name for name in layout.sizes if name != "smoke")
        checkpoint = save_layout(Path(folder), shape, layout, device, dtype)
        sequences = mixed_sequences(checkpoint.reference.config.vocab_size, options.texts)
        reference = run(folder, device, options.smoke, "none", sequences)
        for variant, kernels in (("fp8, fused kernels", True), ("fp8, torch ops", False)):
            if kernels and options.smoke:
                continue
            with contextlib.nullcontext() if kernels else torch_ops_only():
                drifted = run(folder, device, options.smoke, "fp8", sequences)
            report(variant, reference, drifted)
    if not options.smoke:
        check_gated_kernel(checkpoint.reference.config.intermediate_size)


def run(folder: str, device: str, smoke: bool, quantization: str, sequences):
    """(pooled rows, [each layer's residual stream]) of the sequences, one batch at a time, no graphs."""
    import torch

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig

    config = EngineConfig(
        device=device, dtype="float32" if smoke else "bfloat16", max_batch_tokens=16384,
        max_queue_tokens=10**6, cuda_graphs="off", quantization=quantization,
        fp8_min_rows=0 if quantization == "fp8" else None,
    )  # fmt: skip
    with fp8_kept():  # measured here, not turned off (engine/fp8_accuracy.py)
        engine = build_engine(resolve_model(folder), config)
    streams: list[torch.Tensor] = []

    def keep(module, inputs, output):
        hidden, residual = output
        streams.append((hidden + residual).float())

    hooks = [layer.register_forward_hook(keep) for layer in engine.runner.model.backbone.layers]
    engine.start()
    try:
        streams.clear()
        rows = asyncio.run(engine.run(sequences))
    finally:
        engine.stop()
        for hook in hooks:
            hook.remove()
    return torch.as_tensor(rows), list(streams)


def report(variant: str, reference, drifted) -> None:
    import torch.nn.functional as F

    (rows, streams), (drifted_rows, drifted_streams) = reference, drifted
    print(f"== {variant}: pooled rows' min cosine {F.cosine_similarity(rows, drifted_rows).min():.5f}")
    for index, (plain, quantized) in enumerate(zip(streams, drifted_streams)):
        cosine = F.cosine_similarity(plain, quantized, dim=-1)
        print(
            f"  layer {index:2d} (each batch in turn): cosine min {cosine.min():.5f} mean "
            f"{cosine.mean():.5f}; largest magnitude "
            f"{plain.abs().max():.1f}, rms {plain.pow(2).mean().sqrt():.2f}"
        )


@contextlib.contextmanager
def fp8_kept():
    """build_engine without its start-up accuracy check (which would turn FP8 off where it drifts)."""
    from engine import build

    saved = build.keep_fp8_if_accurate
    build.keep_fp8_if_accurate = lambda name, runner, window: None
    try:
        yield
    finally:
        build.keep_fp8_if_accurate = saved


@contextlib.contextmanager
def torch_ops_only():
    """FP8 with torch's quantizing ops in place of posy's fused Triton kernels."""
    from engine.layers import fp8, swiglu

    saved = fp8._quantize_kernel, fp8._activation_kernel, swiglu._triton_kernel
    fp8._quantize_kernel = fp8._activation_kernel = swiglu._triton_kernel = lambda: None
    try:
        yield
    finally:
        fp8._quantize_kernel, fp8._activation_kernel, swiglu._triton_kernel = saved


def check_gated_kernel(intermediate: int) -> None:
    """The fused SiLU-gated product quantized per row, against torch's ops, at `intermediate` columns."""
    import torch

    from engine.layers.fp8 import torch_quantize_rows
    from engine.layers.swiglu import gated

    torch.manual_seed(0)
    gate_up = torch.randn(4096, 2 * intermediate, device="cuda", dtype=torch.bfloat16) * 3
    fused = gated(gate_up, "silu", quantize=True)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = torch_quantize_rows(torch.nn.functional.silu(gate) * up)
    values = (fused.values.float() * fused.scales) - (expected.values.float() * expected.scales)
    mismatched = (fused.values.float() != expected.values.float()).float().mean()
    print(
        f"gated kernel at {intermediate} columns: scales max relative error "
        f"{((fused.scales - expected.scales).abs() / expected.scales).max():.2e}, values differing "
        f"{mismatched:.2e}, largest difference {values.abs().max():.3e}"
    )


if __name__ == "__main__":
    main()
