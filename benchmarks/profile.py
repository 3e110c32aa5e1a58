"""`python -m benchmarks.profile [SHAPE] [BACKEND] [QUANTIZATION] [CASES]`: where an engine step spends its
time (QUANTIZATION "fp8": with --quantization fp8; CASES: a comma-separated subset), on the BERT-base
shape (the default; "bert-large": XLM-R large's transformer, the seed suite's BGE-M3 and its reranker) at
batch 1 x 128, at a full 16k-token batch of 50-token texts and at the scoring suite's 5 and 50 pairs of
512 tokens, on the Qwen3-0.6B shape at one text of 128 and of 4096 tokens
and at 50 x 512 (the judge's body), on a families-suite shape (mpnet-base, qwen2-1.5b, gemma3-300m)
at its 100 mixed texts in one batch, or on the images suite's dual encoders (clip-vit-b16,
siglip-base-p16) at 32 images and at a full 16k-token batch of them: the host's share (pack, step,
wait), a graph replay alone, and every GPU kernel and copy of one step (count, summed time); or on the
images suite's vision-language embedders (qwen2-vl-2b, qwen3-vl-2b) at its 64 images in one request: its
wall time, and its kernels and its operators by input shape (a GEMM's shapes tell the vision tower's from
the decoder's)."""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.checkpoints import save_bert, save_qwen3
    from benchmarks.engine import random_sequences
    from benchmarks.layouts import GEMMA3, MPNET, QWEN2, save_layout
    from engine.batch import pack
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import GPU_MAX_BATCH_TOKENS, EngineConfig

    layout_shapes = {"mpnet-base": MPNET, "qwen2-1.5b": QWEN2, "gemma3-300m": GEMMA3}
    image_shapes = ("clip-vit-b16", "siglip-base-p16")
    images: dict[str, list] = {}
    shape = argv[0] if argv else "bert-base"
    backend = argv[1] if len(argv) > 1 else "auto"
    if "-vl-" in shape:
        profile_vision_language(shape, backend)
        return
    quantization = argv[2] if len(argv) > 2 else "none"
    if quantization == "fp8":  # the engine's log says which projections run in FP8, and their measured gains
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    chosen = argv[3].split(",") if len(argv) > 3 else None
    max_batch_tokens = 32768  # the scoring suite's: 50 pairs of 512 tokens in one graph
    if shape == "qwen3-0.6b":
        checkpoint = save_qwen3(Path(tempfile.mkdtemp()), shape)
        cases = {
            "1x128": random_sequences([128], 1),
            "1x4096": random_sequences([4096], 1),
            "50x512": random_sequences([512] * 50, 3),
        }
    elif shape in image_shapes:
        from benchmarks.images import build

        checkpoint_folder, _ = build(shape, Path(tempfile.mkdtemp()) / shape, smoke=False)
        layout = resolve_model(str(checkpoint_folder)).images
        generator = torch.Generator().manual_seed(0)
        patch_dim = 3 * layout.patch_size**2
        side = layout.image_size // layout.patch_size
        patch = torch.randint(0, 256, (side, side, patch_dim), generator=generator, dtype=torch.uint8)
        counts = {"32img": 32, "full": GPU_MAX_BATCH_TOKENS // layout.num_tokens}
        cases = {name: [[0] * layout.num_tokens] * count for name, count in counts.items()}
        images = {name: [patch.numpy()] * count for name, count in counts.items()}
        max_batch_tokens = GPU_MAX_BATCH_TOKENS
    elif shape in layout_shapes:  # the families suite's shapes, its 100 mixed texts in one batch
        from benchmarks.mixed import MAX_BATCH_TOKENS, mixed_sequences

        layout = layout_shapes[shape]
        checkpoint = save_layout(Path(tempfile.mkdtemp()), shape, layout, "cuda", torch.bfloat16)
        cases = {"mixed100": mixed_sequences(layout.vocab_size)}
        max_batch_tokens = MAX_BATCH_TOKENS
    else:
        checkpoint = save_bert(Path(tempfile.mkdtemp()), shape)
        cases = {
            "batch1x128": random_sequences([128], 1),
            "full-50tok": random_sequences([50] * 327, 2),
            "5x512": random_sequences([512] * 5, 3),
            "50x512": random_sequences([512] * 50, 3),
        }
    if chosen is not None:
        cases = {name: sequences for name, sequences in cases.items() if name in chosen}
    config = EngineConfig(
        device="cuda", dtype="bfloat16", attention_backend=backend, max_batch_tokens=max_batch_tokens,
        max_queue_tokens=2**21, quantization=quantization,
    )  # fmt: skip
    folder = checkpoint_folder if shape in image_shapes else checkpoint.folder
    engine = build_engine(resolve_model(str(folder)), config)
    print(f"{shape}: attention backend {engine.attention_backend}, quantization {quantization}")
    runner = engine.runner
    try:
        for name, sequences in cases.items():
            for _ in range(4):
                runner.step(pack(sequences, images=images.get(name))).result()
            host = []
            for _ in range(50 if shape in ("qwen3-0.6b", *layout_shapes, *image_shapes) else 200):
                start = time.perf_counter()
                batch = pack(sequences, images=images.get(name))
                packed = time.perf_counter()
                lazy = runner.step(batch)
                stepped = time.perf_counter()
                lazy.result()
                host.append((packed - start, stepped - packed, time.perf_counter() - stepped))
            pack_ms, step_ms, wait_ms = (1000 * statistics.median(column) for column in zip(*host))
            print(f"== {name}: pack {pack_ms:.3f} ms, step (host) {step_ms:.3f} ms, wait {wait_ms:.3f} ms")
            graph = (
                runner.graphs.graphs.get(runner.graphs.key(pack(sequences, images=images.get(name))))
                if runner.graphs
                else None
            )
            if graph is not None:
                replays = []
                for _ in range(200):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    graph.graph.replay()
                    torch.cuda.synchronize()
                    replays.append(time.perf_counter() - start)
                print(f"   graph replay + sync alone: p50 {1000 * statistics.median(replays):.3f} ms")
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
                for _ in range(5):
                    runner.step(pack(sequences, images=images.get(name))).result()
            kernels = [
                (event.name, event.time_range.elapsed_us())
                for event in trace.events()
                if event.device_type == torch.autograd.DeviceType.CUDA
            ]
            per_step = len(kernels) / 5
            busy_us = sum(elapsed for _, elapsed in kernels) / 5
            print(f"   {per_step:.0f} GPU kernels/copies per step, {busy_us:.1f} us of GPU time per step")
            summary: dict[str, list[float]] = {}
            for kernel, elapsed in kernels:
                summary.setdefault(kernel[:90], []).append(elapsed)
            for kernel, times in sorted(summary.items(), key=lambda item: -sum(item[1]))[:25]:
                print(f"   {sum(times) / 5:8.1f} us/step  {len(times) / 5:5.1f}x  {kernel}")
    finally:
        engine.stop()


def profile_vision_language(case: str, backend: str) -> None:
    import asyncio

    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.images import png_images, serving_config
    from benchmarks.vision_language import NUM_IMAGES, case_checkpoint, image_grids, sequence_layout
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.outputs import RowRequest

    folder, _ = case_checkpoint(case, Path(tempfile.mkdtemp()) / case, smoke=False)
    spec = resolve_model(str(folder))
    grids = image_grids(png_images(NUM_IMAGES, seed=1), spec.images)
    layout_ids = sequence_layout(spec)
    sequences = [layout_ids(*grid.shape[:2]) for grid in grids]
    engine = build_engine(spec, serving_config("cuda", torch.bfloat16, backend))
    print(f"{case}: attention backend {engine.attention_backend}, {sum(map(len, sequences))} tokens")
    loop = asyncio.new_event_loop()

    def embed() -> None:
        loop.run_until_complete(engine.run(sequences, rows=RowRequest(images=grids)))
        torch.cuda.synchronize()

    try:
        for _ in range(2):
            embed()
        walls = []
        for _ in range(5):
            start = time.perf_counter()
            embed()
            walls.append(time.perf_counter() - start)
        print(f"== {NUM_IMAGES} images: p50 {1000 * statistics.median(walls):.1f} ms")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as trace:
            embed()
        kernels: dict[str, list[float]] = {}
        for event in trace.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels.setdefault(event.name[:100], []).append(event.time_range.elapsed_us())
        busy = sum(map(sum, kernels.values()))
        print(f"   {sum(map(len, kernels.values()))} GPU kernels/copies, {busy / 1000:.1f} ms of GPU time")
        for name, times in sorted(kernels.items(), key=lambda item: -sum(item[1]))[:30]:
            print(f"   {sum(times) / 1000:8.2f} ms  {len(times):5d}x  {name}")
        print("   operators by input shape (device time):")
        averages = trace.key_averages(group_by_input_shape=True)
        for item in sorted(averages, key=lambda item: -item.device_time_total)[:40]:
            total, shapes = item.device_time_total / 1000, str(item.input_shapes)[:110]
            print(f"   {total:8.2f} ms  {item.count:5d}x  {item.key[:40]:40s} {shapes}")
    finally:
        engine.stop()
        loop.close()


if __name__ == "__main__":
    main(sys.argv[1:])
