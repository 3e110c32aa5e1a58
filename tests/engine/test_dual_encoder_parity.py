"""CLIP and SigLIP dual encoders (engine/models/clip.py, dual_encoder.py) against transformers' CLIPModel and
SiglipModel on tiny random checkpoints: text rows, image rows and mixed batches in fp32 within 1e-5 of the
normalized features, the image preprocessing (api/images.py) equal to transformers' processor, and the
engine's requests of texts and images in any order."""

import asyncio
import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from api.images import ImageLimits, decode, normalized, patches, pixels
from benchmarks.image_checkpoints import dual_encoder_checkpoint
from engine.attention import select_backend
from engine.batch import pack
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.outputs import RowRequest
from engine.runner import ModelRunner
from engine.weights import load_model

TOLERANCE = 1e-5
TEXTS = ["a photo of a cat", "the quick brown fox jumps over the lazy dog", "x", "two dogs " * 5]
SIZES = [(40, 50), (64, 32), (20, 20), (33, 97)]  # (height, width): wider, taller, smaller than the crop


def random_images(seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in SIZES]
    rgba = Image.fromarray(rng.integers(0, 256, (24, 30, 4), dtype=np.uint8), "RGBA")
    gray = Image.fromarray(rng.integers(0, 256, (30, 24), dtype=np.uint8), "L")
    return [*images, rgba, gray]


@pytest.fixture(scope="module", params=["clip", "siglip"])
def checkpoint(request, tmp_path_factory):
    return dual_encoder_checkpoint(tmp_path_factory.mktemp(request.param) / request.param, request.param)


def rgb(image: Image.Image) -> Image.Image:
    """The image as the gateway decodes it from a PNG a client sent."""
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return decode(buffer.getvalue(), ImageLimits(), "input")


def reference_rows(model, token_ids, pixel_values):
    """transformers' normalized features: each text alone (no padding), the images in one batch."""

    def features(output):
        return output.pooler_output if hasattr(output, "pooler_output") else output

    with torch.inference_mode():
        texts = [features(model.get_text_features(input_ids=torch.tensor([ids]))) for ids in token_ids]
        images = features(model.get_image_features(pixel_values=torch.as_tensor(pixel_values)))
    return F.normalize(torch.cat(texts), dim=-1).numpy(), F.normalize(images, dim=-1).numpy()


def token_ids(spec, texts):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)]


def engine_inputs(folder, reference):
    """The checkpoint's spec, TEXTS' ids, random_images' patches, and transformers' text and image rows."""
    spec = resolve_model(str(folder))
    layout = spec.images
    ids = token_ids(spec, TEXTS)
    values = np.stack([pixels(rgb(image), layout) for image in random_images()])
    expected_texts, expected_images = reference_rows(reference, ids, normalized(values, layout))
    return spec, ids, [patches(value, layout.patch_size) for value in values], expected_texts, expected_images


def test_preprocessing_matches_the_models_processor(checkpoint):
    """Resize and crop (padding an image smaller than it) on the host, rescale and normalize as the model
    does them (ImageLayout.affine), equal to transformers' processor; transparency over white, grayscale
    made RGB."""
    from transformers import AutoImageProcessor

    folder, _ = checkpoint
    spec = resolve_model(str(folder))
    images = random_images()
    expected = AutoImageProcessor.from_pretrained(folder)(
        images=[image.convert("RGB") for image in images[:4]]
    )
    ours = np.stack([pixels(rgb(image), spec.images) for image in images[:4]])
    assert ours.dtype == np.uint8
    np.testing.assert_allclose(
        normalized(ours, spec.images), np.asarray(expected["pixel_values"]), atol=1e-6, rtol=0
    )
    # RGBA composited over white as transformers' convert_to_rgb does
    reference = AutoImageProcessor.from_pretrained(folder)(images=[images[4]])["pixel_values"]
    ours = normalized(pixels(rgb(images[4]), spec.images), spec.images)
    np.testing.assert_allclose(ours, np.asarray(reference)[0], atol=1e-6, rtol=0)


def test_text_image_and_mixed_rows_match_transformers(checkpoint):
    spec, ids, image_patches, expected_texts, expected_images = engine_inputs(*checkpoint)
    layout = spec.images
    assert spec.task == "embed" and layout is not None
    assert layout.num_tokens == layout.num_patches + (spec.hf_config.model_type == "clip")
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    assert model.output.takes_images
    placeholder = [0] * layout.num_tokens
    # texts and images interleaved in one batch, as the engine may pack them
    sequences, images, expected = [], [], []
    for index in range(max(len(ids), len(image_patches))):
        if index < len(image_patches):
            sequences.append(placeholder)
            images.append(image_patches[index])
            expected.append(expected_images[index])
        if index < len(ids):
            sequences.append(ids[index])
            images.append(None)
            expected.append(expected_texts[index])
    with torch.inference_mode():
        mixed = model(pack(sequences, images=images)).numpy()
        texts_alone = model(pack(ids)).numpy()
        images_alone = model(pack([placeholder] * len(image_patches), images=image_patches)).numpy()
    np.testing.assert_allclose(mixed, np.stack(expected), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(texts_alone, expected_texts, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(images_alone, expected_images, atol=TOLERANCE, rtol=0)
    # the same batch split into its texts and its images (as the runner runs it with CUDA graphs), each
    # row back in the batch's order
    batch = pack(sequences, images=images)
    texts, image_part = batch.towers()
    assert image_part.images.only_images and texts.images is None
    assert (texts.num_seqs, image_part.num_seqs) == (len(ids), len(image_patches))
    with torch.inference_mode():
        split = ModelRunner(model, torch.device("cpu")).run_towers(batch, texts, image_part).numpy()
    np.testing.assert_allclose(split, np.stack(expected), atol=TOLERANCE, rtol=0)
    assert pack(ids).towers() is None and image_part.towers() is None


def test_engine_requests_of_texts_and_images(checkpoint):
    """A request mixing texts and images, split over several batches (max_batch_tokens), gives each
    sequence its own row in order; a text-only engine refuses images before queueing them."""
    spec, ids, image_patches, expected_texts, expected_images = engine_inputs(*checkpoint)
    layout = spec.images
    sequences = [*ids, *([[0] * layout.num_tokens] * len(image_patches))]
    images = [*([None] * len(ids)), *image_patches]
    order = np.random.default_rng(1).permutation(len(sequences))
    config = EngineConfig(device="cpu", dtype="float32", max_batch_tokens=80, max_queue_tokens=10**5)
    engine = build_engine(spec, config)
    try:

        async def run():
            rows = RowRequest(images=[images[i] for i in order])
            return await engine.run([sequences[i] for i in order], rows=rows)

        got = asyncio.run(run())
    finally:
        engine.stop()
    expected = np.concatenate([expected_texts, expected_images])[order]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)


def test_a_batch_holds_an_image_longer_than_the_text_window(tmp_path):
    # ViT-B/16's 197 tokens an image against CLIP's 77-token texts: the engine's longest sequence (its
    # CUDA graphs' length buckets) is the image's, its text window stays the texts'
    folder, _ = dual_encoder_checkpoint(tmp_path / "clip", "clip", image_size=224, patch_size=16)
    spec = resolve_model(str(folder))
    assert (spec.max_seq_length, spec.images.num_tokens, spec.longest_sequence) == (77, 197, 197)


def test_a_text_model_refuses_images(minilm_path):
    spec = resolve_model(str(minilm_path))
    engine = build_engine(spec, EngineConfig(device="cpu", dtype="float32"))
    try:

        async def run():
            rows = RowRequest(images=[np.zeros((2, 2, 12), dtype=np.uint8)])
            return await engine.run([[0] * 4], rows=rows)

        with pytest.raises(ValueError, match="takes no images"):
            asyncio.run(run())
    finally:
        engine.stop()


@pytest.mark.parametrize("patch_size", [8, 7])
def test_through_two_replicas(tmp_path, patch_size):
    """Two replica processes (chunks of at most 64 tokens) give a request of texts and images the rows the
    engine in process gives: the patches cross the request ring with their sequences (8-bit; of 7x7
    patches, 9 an image, 1,323 bytes: not whole words)."""
    from engine.checkpoint.source import ModelSource
    from engine.replicas.replica_set import ReplicaSet

    size = 32 if patch_size == 8 else 21
    folder, reference = dual_encoder_checkpoint(
        tmp_path / "clip", "clip", image_size=size, patch_size=patch_size
    )
    spec, ids, image_patches, expected_texts, expected_images = engine_inputs(folder, reference)
    layout = spec.images
    sequences = [[0] * layout.num_tokens] * len(image_patches) + ids
    images = [*image_patches, *([None] * len(ids))]
    config = EngineConfig(device="cpu", dtype="float32", max_batch_tokens=64, max_queue_tokens=10**5)
    replica_set = ReplicaSet(ModelSource(str(folder)), 2, config)
    replica_set.start()
    try:

        async def run():
            return (await replica_set.pool.enqueue(sequences * 3, rows=RowRequest(images=images * 3))).rows

        got = asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        replica_set.stop()
    expected = np.concatenate([expected_images, expected_texts] * 3)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)


def test_a_request_whose_pixels_fill_most_of_the_request_ring(tmp_path):
    """40 images of 224 pixels in 16-pixel patches (6 MB of 8-bit pixels, most of the 8 MiB request ring)
    through a replica process give the rows of the engine in process; a replica that reads them wrong
    (past the ring) fails the request rather than its thread."""
    from engine.checkpoint.source import ModelSource
    from engine.replicas.link import REQUEST_RING_BYTES
    from engine.replicas.replica_set import ReplicaSet

    folder, _ = dual_encoder_checkpoint(tmp_path / "clip", "clip", image_size=224, patch_size=16)
    spec = resolve_model(str(folder))
    layout = spec.images
    rng = np.random.default_rng(2)
    side = layout.image_size // layout.patch_size
    shape = (side, side, 3 * layout.patch_size**2)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(40)]
    assert sum(image.nbytes for image in images) > 0.7 * REQUEST_RING_BYTES
    sequences = [[0] * layout.num_tokens] * len(images)
    config = EngineConfig(device="cpu", dtype="float32", max_batch_tokens=16384, max_queue_tokens=10**6)
    engine = build_engine(spec, config)
    try:
        expected = asyncio.run(engine.run(sequences, rows=RowRequest(images=images)))
    finally:
        engine.stop()
    replica_set = ReplicaSet(ModelSource(str(folder)), 1, config)
    replica_set.start()
    try:

        async def run():
            return (await replica_set.pool.enqueue(sequences, rows=RowRequest(images=images))).rows

        got = asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        replica_set.stop()
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
