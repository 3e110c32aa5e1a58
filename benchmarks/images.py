"""The images suite (CUDA): image embeddings of dual encoders against transformers' own model, on real-size
random weights (CLIP ViT-B/16 and SigLIP base at 224 px; SigLIP2 base in NaFlex, each image at its own
aspect in at most 256 patches of 16, which transformers pads to 256 and posy packs), bf16 on both sides,
in the same run:
- `embed`: 256 images, preprocessed on the host (api/images.py, each image decoded from a PNG), through
  posy's engine as one request, against transformers' get_image_features in batches of 32 from the same
  pixels: images per second and image tokens per second, host preprocessing timed apart (images per
  second on one thread);
- `rerank-50`: a text query against 50 images (each image's row and the query's, cosine), one request at
  a time: p50 latency of posy's engine against transformers' (text and images in one call each);
- parity: the minimum cosine of posy's image rows against transformers' fp32 rows;
- through HTTP, what a client sees (a `posy serve` process, the images as PNG data URIs in JSON bodies
  encoded before the clock starts): `embed-http`,
  the 256 images in requests of 32 from 4 clients at once (images per second), and `rerank-http-50`, a
  /v2/rerank of a text query against 50 images, one request at a time (p50), each against transformers
  doing the same work from the same PNGs (PIL decode, its image processor, the model; the 50 images and
  the query in one call).
The qwen2-vl-2b and qwen3-vl-2b cases are vision-language embedders' (benchmarks/vision_language.py:
engine images per second against transformers' own model, and parity). The HTTP cases also record the
server's own p50s (its timing headers: total, tokenization, which is where images are decoded, queue and
inference). `--shapes` picks cases; `--smoke` runs tiny shapes on the CPU."""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.records import RunContext, SuiteOutcome, engine_backend, run_cases
from benchmarks.timing import timed

NUM_IMAGES, SMOKE_IMAGES = 256, 8
RERANK_IMAGES = 50
REFERENCE_BATCH = 32
MIN_COSINE = 0.995
SPEEDUP = 3.0  # posy through HTTP against transformers from the same PNGs (the target)
CASES = ("clip-vit-b16", "siglip-base-p16", "siglip2-base-p16-naflex", "qwen2-vl-2b", "qwen3-vl-2b")
NAFLEX_PATCHES = 256  # SigLIP2 NaFlex's max_num_patches: each image's own grid of at most 256 patches of 16


def serving_config(device: str, dtype, backend: str):
    """The engine config of a suite's engine: the batch size `posy serve` takes on this device (16k tokens
    on a GPU: 83 images of 197)."""
    from engine.config import QUEUE_BATCHES, EngineConfig, default_max_batch_tokens

    max_batch_tokens = default_max_batch_tokens(device)
    return EngineConfig(
        device=device, dtype=str(dtype).removeprefix("torch."), attention_backend=backend,
        max_batch_tokens=max_batch_tokens, max_queue_tokens=QUEUE_BATCHES * max_batch_tokens,
    )  # fmt: skip


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

    kind = case.split("-")[0]
    if smoke:
        return dual_encoder_checkpoint(folder, kind)
    text = BASE_TEXT if kind == "clip" else SIGLIP_BASE_TEXT
    projection = 512 if kind == "clip" else BASE_VISION["hidden_size"]
    size = 16 * int(NAFLEX_PATCHES**0.5) if kind == "siglip2" else 224  # NaFlex: sized by its patches
    return dual_encoder_checkpoint(
        folder, kind, text, BASE_VISION, image_size=size, patch_size=16, projection_dim=projection, std=0.02
    )


def measure_case(case: str, options: argparse.Namespace, device: str, gpu: str | None, smoke: bool):
    import torch
    import torch.nn.functional as F

    from api.images import ImageLimits, decode, normalized, patches, pixels
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
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
        naflex = layout.max_num_patches is not None  # each image its own grid (SigLIP2)
        image_patches = [patches(value, layout.patch_size, channels_last=naflex) for value in values]
        # an image's placeholders: its patches (and CLIP's class token), as the server lays them out
        image_tokens = [
            grid.shape[0] * grid.shape[1] if naflex else layout.num_tokens for grid in image_patches
        ]
        dtype = torch.float32 if smoke else torch.bfloat16
        engine = build_engine(spec, serving_config(device, dtype, options.backend))
        ctx = RunContext(suite="images", model=case, gpu=gpu, backend=engine_backend(engine))
        placeholders = [[0] * tokens for tokens in image_tokens]
        query = [5, 6, 7, 8, 9, 10, 11, 12]
        loop = asyncio.new_event_loop()

        def posy_embed():
            rows = RowRequest(images=list(image_patches))
            return loop.run_until_complete(engine.run(placeholders, rows=rows))

        def posy_rerank():
            subset = image_patches[:RERANK_IMAGES]
            rows = RowRequest(images=[None, *subset])
            sequences = [query, *placeholders[:RERANK_IMAGES]]
            vectors = loop.run_until_complete(engine.run(sequences, rows=rows))
            return vectors[1:] @ vectors[0]

        # transformers' inputs, preprocessed once as posy's are: the pixels, and NaFlex's padded patches
        # with their masks and grids (its processor's)
        if naflex:
            from PIL import Image
            from transformers import AutoImageProcessor

            processor = AutoImageProcessor.from_pretrained(folder)
            reference_inputs = dict(
                processor(images=[Image.open(io.BytesIO(data)) for data in encoded], return_tensors="pt")
            )
        else:
            reference_inputs = {
                "pixel_values": torch.as_tensor(np.stack([normalized(value, layout) for value in values]))
            }
        reference = reference.to(device)

        def reference_batch(start: int, stop: int, model_dtype) -> dict:
            return {
                name: value[start:stop].to(device, model_dtype if name == "pixel_values" else value.dtype)
                for name, value in reference_inputs.items()
            }

        def features(output):
            return output.pooler_output if hasattr(output, "pooler_output") else output

        def transformers_embed(model, model_dtype=dtype):
            with torch.inference_mode():
                rows = [
                    features(model.get_image_features(**reference_batch(i, i + REFERENCE_BATCH, model_dtype)))
                    for i in range(0, count, REFERENCE_BATCH)
                ]
                return F.normalize(torch.cat(rows).float(), dim=-1).cpu().numpy()

        def transformers_rerank(model):
            with torch.inference_mode():
                images = features(model.get_image_features(**reference_batch(0, RERANK_IMAGES, dtype)))
                text = features(model.get_text_features(input_ids=torch.tensor([query], device=device)))
                return (F.normalize(images.float(), dim=-1) @ F.normalize(text.float(), dim=-1).T).cpu()

        expected = transformers_embed(reference, model_dtype=torch.float32)
        half = reference.to(dtype)
        ours = posy_embed()
        cosine = float((ours * expected).sum(1).min())
        posy_s = statistics.median(timed(posy_embed, rounds + 1, device)[1:])
        theirs_s = statistics.median(timed(lambda: transformers_embed(half), rounds + 1, device)[1:])
        tokens = sum(image_tokens)
        rerank_posy = statistics.median(timed(posy_rerank, 4 * rounds + 1, device)[1:])
        rerank_theirs = statistics.median(
            timed(lambda: transformers_rerank(half), 4 * rounds + 1, device)[1:]
        )
        engine.stop()
        loop.close()
        http = measure_http(folder, encoded, half, device, dtype, rounds, smoke)
    tokens_an_image = tokens / count
    records = [
        ctx.record(f"{case} embed", "images_per_s", count / posy_s, "images/s", count / theirs_s),
        ctx.record(f"{case} embed", "tokens_per_s", tokens / posy_s, "tokens/s", tokens / theirs_s),
        ctx.record(f"{case} embed", "min_cosine_vs_fp32", cosine, "cosine"),
        ctx.record(f"{case} preprocess", "images_per_s_one_thread", count / preprocess_s, "images/s"),
        ctx.record(f"{case} rerank-50", "p50_ms", 1000 * rerank_posy, "ms", 1000 * rerank_theirs),
        ctx.record(f"{case} embed-http", "images_per_s", http["embed"][0], "images/s", http["embed"][1]),
        ctx.record(
            f"{case} embed-http",
            "tokens_per_s",
            http["embed"][0] * tokens_an_image,
            "tokens/s",
            http["embed"][1] * tokens_an_image,
        ),
        ctx.record(f"{case} rerank-http-50", "p50_ms", http["rerank"][0], "ms", http["rerank"][1]),
        *(
            ctx.record(
                f"{case} {'embed-http' if kind == 'embed' else 'rerank-http-50'}",
                f"server_{stage}_p50_ms",
                value,
                "ms",
            )
            for (kind, stage), value in http["server"].items()
        ),
    ]
    # the target holds for what a client sees; the engine's ratio is its ceiling, printed: transformers pads
    # nothing at one image size, and 3x its engine figure is past the card (posy's 1.76M tokens/s of
    # ViT-B/16 on an H100 is 310 TFLOP/s, a third of its bf16 peak)
    print(f"{case}: engine images/s {theirs_s / posy_s:.2f}x transformers'")
    speedups = {
        "HTTP images/s": http["embed"][0] / http["embed"][1],
        "HTTP 50-image rerank p50": http["rerank"][1] / http["rerank"][0],
    }
    short = [f"{name} {value:.2f}x" for name, value in speedups.items() if value < SPEEDUP]
    failure = None
    if cosine < MIN_COSINE:
        failure = f"image rows at cosine {cosine:.4f} of fp32 (< {MIN_COSINE})"
    elif not smoke and short:
        failure = f"against transformers, below {SPEEDUP}x: {', '.join(short)}"
    for record in records:
        print(f"{record.case} {record.metric}: {record.value:.4g} (baseline {record.baseline})")
    return records, failure


HTTP_BATCH, HTTP_CLIENTS = 32, 4
JSON = {"content-type": "application/json"}
# the server's timing headers (ms), recorded as p50s: where a request's time went inside it
SERVER_STAGES = ("total", "tokenization", "queue", "inference")


def measure_http(folder: Path, encoded: list[bytes], model, device: str, dtype, rounds: int, smoke: bool):
    """{"embed": (posy's images/s, transformers'), "rerank": (posy's p50 ms, transformers')}."""
    import base64
    import json
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import torch
    import torch.nn.functional as F
    from PIL import Image
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    from benchmarks.live_server import serve

    uris = [f"data:image/png;base64,{base64.b64encode(data).decode()}" for data in encoded]
    query = "a photo of a dog on a beach"
    # the bodies are encoded before the clock starts, as a load generator's are: Python's json takes about
    # 50 ms a 12 MB body, which four client threads sharing one GIL would otherwise add to the server's time
    parts = [{"type": "image_url", "image_url": {"url": uri}} for uri in uris]
    bodies = [
        json.dumps({"input": parts[start : start + HTTP_BATCH], "encoding_format": "base64"}).encode()
        for start in range(0, len(uris), HTTP_BATCH)
    ]
    documents = [{"image": uri} for uri in uris[:RERANK_IMAGES]]
    rerank_body = json.dumps({"query": query, "documents": documents}).encode()
    flags = ["--max-body-bytes", str(256 << 20), "--device", device]
    if smoke:
        flags += ["--dtype", "float32"]
    timings: dict[str, list[dict[str, float]]] = {"embed": [], "rerank": []}

    def keep(kind: str, response) -> None:
        response.raise_for_status()
        headers = response.headers
        timings[kind].append({stage: float(headers[f"x-{stage}-time"]) for stage in SERVER_STAGES})

    with serve(folder, *flags) as url, httpx.Client(base_url=url, timeout=120, trust_env=False) as client:

        def embed(body):
            keep("embed", client.post("/v1/embeddings", content=body, headers=JSON))

        def embed_all():
            with ThreadPoolExecutor(HTTP_CLIENTS) as pool:
                list(pool.map(embed, bodies))

        def rerank():
            keep("rerank", client.post("/v2/rerank", content=rerank_body, headers=JSON))

        embed_all()  # warm-up: graphs, the tokenizer threads' first parts
        rerank()
        timings["embed"].clear()
        timings["rerank"].clear()
        posy_embed = statistics.median(timed(embed_all, rounds, "cpu"))
        posy_rerank = statistics.median(timed(rerank, 4 * rounds, "cpu"))

    processor = AutoImageProcessor.from_pretrained(folder)
    query_ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(query).ids

    def features(output):
        return output.pooler_output if hasattr(output, "pooler_output") else output

    def transformers_images(items: list[bytes]) -> torch.Tensor:
        rows = []
        for start in range(0, len(items), HTTP_BATCH):
            images = [Image.open(io.BytesIO(data)) for data in items[start : start + HTTP_BATCH]]
            inputs = processor(images=images, return_tensors="pt")
            inputs = {
                name: value.to(device, dtype if name == "pixel_values" else value.dtype)
                for name, value in inputs.items()
            }
            with torch.inference_mode():
                rows.append(features(model.get_image_features(**inputs)))
        return F.normalize(torch.cat(rows).float(), dim=-1)

    def transformers_rerank():
        images = transformers_images(encoded[:RERANK_IMAGES])
        with torch.inference_mode():
            text = features(model.get_text_features(input_ids=torch.tensor([query_ids], device=device)))
        return (images @ F.normalize(text.float(), dim=-1).T).cpu()

    theirs_embed = statistics.median(timed(lambda: transformers_images(encoded).cpu(), rounds, device))
    theirs_rerank = statistics.median(timed(transformers_rerank, 4 * rounds, device))
    count = len(encoded)
    server = {
        (kind, stage): statistics.median(times[stage] for times in timings[kind])
        for kind in timings
        for stage in SERVER_STAGES
    }
    return {
        "embed": (count / posy_embed, count / theirs_embed),
        "rerank": (1000 * posy_rerank, 1000 * theirs_rerank),
        "server": server,
    }


def run(options: argparse.Namespace) -> SuiteOutcome:
    def measure(case, device: str, gpu: str | None, smoke: bool):
        if "-vl-" in case:  # a vision-language embedder (benchmarks/vision_language.py)
            from benchmarks.vision_language import measure_vision_language

            return measure_vision_language(case, options, device, gpu, smoke)
        return measure_case(case, options, device, gpu, smoke)

    shapes = getattr(options, "shapes", None)
    cases = [case for case in CASES if shapes is None or case in shapes.split(",")]
    return run_cases(cases, str, measure, getattr(options, "smoke", False), getattr(options, "append", None))
