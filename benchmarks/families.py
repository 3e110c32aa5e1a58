"""The families suite (CUDA): posy's engine against HF transformers on real-size random-weight shapes of
several model families, bf16, 100 mixed texts of 16..512 tokens (benchmarks/mixed.py), both in the same
run: real tokens per second on each side, their ratio against the shape's target (3x HF for encoders, 4x
for decoders, 1x for the transformers fallback), and posy's min cosine against HF in fp32. A shape records
whichever implementation ran: its backend is "transformers (...)" where the fallback did, posy's attention
backend where posy's packed model did. `--shapes a,b` picks shapes; `--smoke` runs tiny ones on the CPU."""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from benchmarks.baseline import DEFAULT_BATCH_SIZE, Baseline, min_cosine
from benchmarks.checkpoints import Checkpoint, save_qwen3
from benchmarks.layouts import DEBERTA_V2, GEMMA3, MPNET, QWEN2, save_layout
from benchmarks.mixed import NUM_TEXTS, engine_config, measure, mixed_sequences
from benchmarks.records import Record, RunContext, SuiteOutcome, engine_backend, implementation

MIN_COSINE = 0.999  # posy in bf16 against the reference in fp32 ("same vector", DESIGN.md)
CASE = "{}-mixed100"
SMOKE_TEXTS = 12  # of the same 16..512 tokens: seconds a shape on the CPU


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    size: str  # the real size's name; "smoke" replaces it under --smoke
    save: Callable[..., Checkpoint]  # (folder, size, device, dtype) -> the random-weight folder
    target: float  # posy's real tokens per second over HF's, at least
    model_impl: str = "auto"  # resolve_model's: "transformers" forces the fallback
    hf_batch_size: int = DEFAULT_BATCH_SIZE


def qwen3_embedder(folder: Path, size: str, device: str, dtype) -> Checkpoint:
    return save_qwen3(folder, size)  # made on the CPU and stored in float32, as the qwen3 suite has it


SHAPES = (
    Shape("mpnet-base", "mpnet-base", partial(save_layout, layout=MPNET), target=3.0),
    Shape("qwen2-1.5b", "qwen2-1.5b", partial(save_layout, layout=QWEN2), target=4.0, hf_batch_size=16),
    Shape("gemma3-300m", "gemma3-300m", partial(save_layout, layout=GEMMA3), target=4.0),
    Shape("qwen3-0.6b", "qwen3-0.6b", qwen3_embedder, target=4.0, hf_batch_size=16),
    Shape("fallback-mpnet-base", "mpnet-base", partial(save_layout, layout=MPNET), 1.0, "transformers"),
    Shape("deberta-v3-base", "deberta-v3-base", partial(save_layout, layout=DEBERTA_V2), target=1.0),
)  # fmt: skip


def chosen(names: str | None) -> list[Shape]:
    """The shapes `--shapes` names (comma-separated, in its order), or all of them."""
    if not names:
        return list(SHAPES)
    by_name = {shape.name: shape for shape in SHAPES}
    unknown = [name for name in names.split(",") if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}; the families suite has {', '.join(by_name)}")
    return [by_name[name] for name in names.split(",")]


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    smoke = getattr(options, "smoke", False)
    device = "cpu" if smoke else "cuda"
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    records, failures, rows = [], [], []
    for shape in chosen(getattr(options, "shapes", None)):
        try:
            measured = measure_shape(shape, options, device, gpu, smoke)
        except Exception as error:  # reported as the shape's failure; the next shape still runs
            failures.append(f"{shape.name}: {type(error).__name__}: {error}")
            print(f"{shape.name}: FAILED {type(error).__name__}: {error}")
            measured = []
        finally:
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        records += measured
        if measured:
            rows.append(summary(shape, *measured))
            if measured[2].value < MIN_COSINE:
                failures.append(f"{shape.name}: min cosine {measured[2].value:.5f} < {MIN_COSINE}")
    print_table(rows)
    return SuiteOutcome(records, failures)


def measure_shape(shape: Shape, options, device: str, gpu: str | None, smoke: bool) -> list[Record]:
    """[tokens per second, speedup against the target, min cosine] of one shape; its weights, engine and
    baseline are gone when it returns."""
    import torch

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model

    dtype = torch.float32 if smoke else torch.bfloat16
    rounds = 1 if smoke else options.rounds
    with tempfile.TemporaryDirectory(prefix=f"posy-{shape.name}-") as folder:
        checkpoint = shape.save(Path(folder), "smoke" if smoke else shape.size, device=device, dtype=dtype)
        spec = resolve_model(folder, model_impl=shape.model_impl)
        baseline = Baseline(checkpoint, device, dtype, batch_size=shape.hf_batch_size)
        engine = build_engine(spec, engine_config(device, dtype, options.backend))
        loop = asyncio.new_event_loop()
        try:
            mixed = mixed_sequences(
                checkpoint.reference.config.vocab_size, SMOKE_TEXTS if smoke else NUM_TEXTS
            )
            rates = measure(engine, baseline, mixed, rounds, device, loop)
            baseline.to(torch.float32)  # parity, against HF in fp32 on the same weights
            cosine = min_cosine(rates.vectors, baseline.embed_ids(mixed))
        finally:
            engine.stop()
            loop.close()
    context = RunContext(options.suite, f"{shape.size}-shape (random weights)", gpu, engine_backend(engine))
    case = CASE.format(shape.name)
    ratio = rates.posy / rates.hf
    hf_attention = getattr(baseline.model.config, "_attn_implementation", "?")
    print(
        f"{shape.name}: {spec.implementation}, backend {context.backend}: "
        f"posy {rates.posy / 1e3:.0f}k tokens/s, HF ({hf_attention}) {rates.hf / 1e3:.0f}k: "
        f"{ratio:.2f}x (target {shape.target:g}x), min cosine {cosine:.5f}"
    )
    return [
        context.record(case, "real_tokens_per_s", rates.posy, "tokens/s", rates.hf),
        context.record(case, "speedup_vs_target", ratio, "x", shape.target),  # ratio >= 1: met
        context.record(case, "min_cosine_vs_fp32_reference", cosine, "cosine"),
    ]


def summary(shape: Shape, tokens: Record, speedup: Record, cosine: Record) -> tuple[str, ...]:
    met = "met" if speedup.value >= shape.target else "MISSED"
    return (
        shape.name, implementation(tokens.backend), tokens.backend, f"{tokens.value:,.0f}",
        f"{tokens.baseline:,.0f}", f"{speedup.value:.2f}x", f"{shape.target:g}x {met}", f"{cosine.value:.5f}",
    )  # fmt: skip


def print_table(rows: list[tuple[str, ...]]) -> None:
    header = ("shape", "impl", "backend", "posy tok/s", "HF tok/s", "ratio", "target", "min cosine")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
