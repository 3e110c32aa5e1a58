"""The images suite (CUDA): image embeddings of dual encoders against transformers' own model, on real-size
random weights (CLIP ViT-B/16 and SigLIP base at 224 px), bf16 on both sides, in the same run:
- `embed`: 256 images, preprocessed on the host (api/images.py, each image decoded from a PNG), through
  posy's engine as one request, against transformers' get_image_features in batches of 32 from the same
  pixels: images per second and image tokens per second, host preprocessing timed apart (images per
  second on one thread);
- `rerank-50`: a text query against 50 images (each image's row and the query's, cosine), one request at
  a time: p50 latency of posy's engine against transformers' (text and images in one call each);
- parity: the minimum cosine of posy's image rows against transformers' fp32 rows.
`--smoke` runs tiny shapes on the CPU."""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.records import RunContext, SuiteOutcome, engine_backend
from benchmarks.timing import timed

NUM_IMAGES, SMOKE_IMAGES = 256, 8
RERANK_IMAGES = 50
REFERENCE_BATCH = 32
MIN_COSINE = 0.995
SPEEDUP = 3.0  # posy's images per second against transformers' (the issue's target)
CASES = ("clip-vit-b16", "siglip-base-p16")


def png_images(count: int, seed: int) -> list[bytes]:
    """Random photos-sized PNGs (320x240 to 640x480), as a client sends them."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    encoded = []
    for _ in range(count):
        height, width = int(rng.integers(240, 481)), int(rng.integers(320, 641))
        # smooth noise compresses like a photo, not like white noise
        small = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((width, height))
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        encoded.append(buffer.getvalue())
    return encoded


def build(case: str, folder: Path, smoke: bool):
    from benchmarks.image_checkpoints import BASE_TEXT, BASE_VISION, SIGLIP_BASE_TEXT, dual_encoder_checkpoint

    kind = "clip" if case.startswith("clip") else "siglip"
    if smoke:
        return dual_encoder_checkpoint(folder, kind)
    text = BASE_TEXT if kind == "clip" else SIGLIP_BASE_TEXT
    projection = 512 if kind == "clip" else BASE_VISION["hidden_size"]
    return dual_encoder_checkpoint(
        folder, kind, text, BASE_VISION, image_size=224, patch_size=16, projection_dim=projection, std=0.02
    )


def measure_case(case: str, options: argparse.Namespace, device: str, gpu: str | None, smoke: bool):
    import torch
    import torch.nn.functional as F

    from api.images import ImageLimits, decode, patches, pixels
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig
    from engine.outputs import RowRequest

    count = SMOKE_IMAGES if smoke else NUM_IMAGES
    rounds = 1 if smoke else options.rounds
    with tempfile.TemporaryDirectory() as directory:
        folder, reference = build(case, Path(directory) / case, smoke)
        spec = resolve_model(str(folder))
        layout = spec.images
        encoded = png_images(count, seed=1)
        started = time.perf_counter()
        values = [pixels(decode(data, ImageLimits(), "input"), layout) for data in encoded]
        preprocess_s = time.perf_counter() - started
        image_patches = [patches(value, layout.patch_size) for value in values]
        dtype = torch.float32 if smoke else torch.bfloat16
        config = EngineConfig(
            device=device, dtype=str(dtype).removeprefix("torch."), attention_backend=options.backend
        )
        engine = build_engine(spec, config)
        ctx = RunContext(suite="images", model=case, gpu=gpu, backend=engine_backend(engine))
        placeholder = [0] * layout.num_tokens
        query = [5, 6, 7, 8, 9, 10, 11, 12]
        loop = asyncio.new_event_loop()

        def posy_embed(items=image_patches):
            rows = RowRequest(images=list(items))
            return loop.run_until_complete(engine.run([placeholder] * len(items), rows=rows))

        def posy_rerank():
            subset = image_patches[:RERANK_IMAGES]
            rows = RowRequest(images=[None, *subset])
            vectors = loop.run_until_complete(engine.run([query] + [placeholder] * len(subset), rows=rows))
            return vectors[1:] @ vectors[0]

        pixel_values = torch.as_tensor(np.stack(values))
        reference = reference.to(device)

        def features(output):
            return output.pooler_output if hasattr(output, "pooler_output") else output

        def transformers_embed(model, batch=pixel_values, model_dtype=dtype):
            with torch.inference_mode():
                rows = [
                    features(
                        model.get_image_features(
                            pixel_values=batch[i : i + REFERENCE_BATCH].to(device, model_dtype)
                        )
                    )
                    for i in range(0, len(batch), REFERENCE_BATCH)
                ]
                return F.normalize(torch.cat(rows).float(), dim=-1).cpu().numpy()

        def transformers_rerank(model):
            with torch.inference_mode():
                images = features(
                    model.get_image_features(pixel_values=pixel_values[:RERANK_IMAGES].to(device, dtype))
                )
                text = features(model.get_text_features(input_ids=torch.tensor([query], device=device)))
                return (F.normalize(images.float(), dim=-1) @ F.normalize(text.float(), dim=-1).T).cpu()

        expected = transformers_embed(reference, model_dtype=torch.float32)
        half = reference.to(dtype)
        ours = posy_embed()
        cosine = float((ours * expected).sum(1).min())
        posy_s = statistics.median(timed(posy_embed, rounds + 1, device)[1:])
        theirs_s = statistics.median(timed(lambda: transformers_embed(half), rounds + 1, device)[1:])
        tokens = count * layout.num_tokens
        rerank_posy = statistics.median(timed(posy_rerank, 4 * rounds + 1, device)[1:])
        rerank_theirs = statistics.median(
            timed(lambda: transformers_rerank(half), 4 * rounds + 1, device)[1:]
        )
        engine.stop()
        loop.close()
    records = [
        ctx.record("embed", "images_per_s", count / posy_s, "images/s", count / theirs_s),
        ctx.record("embed", "tokens_per_s", tokens / posy_s, "tokens/s", tokens / theirs_s),
        ctx.record("embed", "min_cosine_vs_fp32", cosine, "cosine"),
        ctx.record("preprocess", "images_per_s_one_thread", count / preprocess_s, "images/s"),
        ctx.record("rerank-50", "p50_ms", 1000 * rerank_posy, "ms", 1000 * rerank_theirs),
    ]
    failure = None
    if cosine < MIN_COSINE:
        failure = f"{case}: image rows at cosine {cosine:.4f} of fp32 (< {MIN_COSINE})"
    elif not smoke and theirs_s / posy_s < SPEEDUP:
        failure = f"{case}: {theirs_s / posy_s:.2f}x transformers' images per second (< {SPEEDUP}x)"
    for record in records:
        print(f"{case} {record.case} {record.metric}: {record.value:.4g} (baseline {record.baseline})")
    return records, failure


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    smoke = getattr(options, "smoke", False)
    device = "cpu" if smoke else "cuda"
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    records, failures = [], []
    for case in CASES:
        try:
            measured, failure = measure_case(case, options, device, gpu, smoke)
        except Exception as error:  # the case's failure; the next case still runs
            measured, failure = [], f"{case}: {type(error).__name__}: {error}"
        finally:
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        records += measured
        if failure:
            failures.append(failure)
            print(failure)
    return SuiteOutcome(records, failures)
