"""SigLIP2's NaFlex (engine/models/clip.py's SIGLIP2 variant) against transformers' Siglip2Model and its own
image processor on a tiny random checkpoint: images of any size and aspect resized to at most its
max_num_patches whole patches, each patch's pixels row, column, channel (api/images.py equal to the
processor's pixel values and spatial shapes), the position table resampled to each image's grid; image
rows of images of different grids packed in one batch beside texts, through HTTP as through the engine,
in fp32 within 1e-5 of the normalized features."""

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from litestar.testing import TestClient
from PIL import Image

from api.app import create_app
from api.config import ServerConfig
from api.images import ImageLimits, decode, normalized, patches, pixels
from benchmarks.image_checkpoints import dual_encoder_checkpoint
from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.weights import load_model
from tests.api.test_vision_language_inputs import data_uri

TOLERANCE = 1e-5
# (height, width): wide, tall, tiny (scaled up to its patches), large (scaled down), square
SIZES = [(40, 90), (97, 33), (5, 7), (300, 260), (64, 64)]
TEXTS = ["a photo of a cat", "two dogs on a beach"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return dual_encoder_checkpoint(tmp_path_factory.mktemp("siglip2") / "siglip2", "siglip2")


def pngs(seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    images = []
    for height, width in SIZES:
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
        images.append(buffer.getvalue())
    return images


def reference(model, folder, texts, images):
    """transformers' normalized text features (each padded to 64, as the processor pads) and image features
    of its processor's padded patches, masks and spatial shapes."""
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pad = tokenizer.token_to_id("<pad>")
    ids = [tokenizer.encode(text).ids for text in texts]
    ids = torch.tensor([one + [pad] * (64 - len(one)) for one in ids])
    processor = AutoImageProcessor.from_pretrained(folder)
    inputs = processor(
        images=[Image.open(io.BytesIO(data)).convert("RGB") for data in images], return_tensors="pt"
    )
    with torch.inference_mode():
        text_rows = model.get_text_features(input_ids=ids) if texts else torch.zeros(0, 1)
        image_rows = model.get_image_features(**inputs)
    features = [getattr(rows, "pooler_output", rows) for rows in (text_rows, image_rows)]
    return [F.normalize(rows, dim=-1).numpy() for rows in features], inputs


def test_preprocessing_matches_the_models_processor(checkpoint):
    folder, model = checkpoint
    spec = resolve_model(str(folder))
    layout = spec.images
    _, inputs = reference(model, folder, [], pngs())
    for index, data in enumerate(pngs()):
        values = pixels(decode(data, ImageLimits(), "input"), layout)
        grid = patches(normalized(values, layout), layout.patch_size, channels_last=True)
        rows, columns = grid.shape[:2]
        assert (rows, columns) == tuple(inputs["spatial_shapes"][index].tolist())
        assert rows * columns <= layout.max_num_patches
        expected = inputs["pixel_values"][index][: rows * columns].numpy()
        np.testing.assert_allclose(grid.reshape(rows * columns, -1), expected, atol=1e-6, rtol=0)


def test_images_of_different_grids_packed_beside_texts_match_transformers(checkpoint):
    folder, model = checkpoint
    spec = resolve_model(str(folder))
    layout = spec.images
    (expected_texts, expected_images), _ = reference(model, folder, TEXTS, pngs())
    grids = [
        patches(pixels(decode(data, ImageLimits(), "input"), layout), layout.patch_size, channels_last=True)
        for data in pngs()
    ]
    assert len({grid.shape[:2] for grid in grids}) > 2  # the grids differ: the positions are resampled
    ours = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    assert ours.output.image_grids
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    pad = tokenizer.token_to_id("<pad>")
    texts = [ids + [pad] * (64 - len(ids)) for ids in (tokenizer.encode(text).ids for text in TEXTS)]
    sequences = [texts[0], *([0] * (g.shape[0] * g.shape[1]) for g in grids), texts[1]]
    with torch.inference_mode():
        rows = ours(pack(sequences, images=[None, *grids, None], output=ours.output)).numpy()
        alone = ours(pack(sequences[1:-1], images=grids, output=ours.output)).numpy()
    np.testing.assert_allclose(rows[1:-1], expected_images, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(alone, expected_images, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(rows[[0, -1]], expected_texts, atol=TOLERANCE, rtol=0)


def test_through_http(checkpoint):
    folder, model = checkpoint
    (expected_texts, expected_images), _ = reference(model, folder, TEXTS, pngs())
    parts = [{"type": "image_url", "image_url": {"url": data_uri(data)}} for data in pngs()]
    config = ServerConfig(models=(str(folder),), served_model_names=(("siglip2",),), tokenizer_threads=2)
    with TestClient(create_app(config)) as client:
        response = client.post(
            "/v1/embeddings", json={"model": "siglip2", "input": [TEXTS[0], *parts, TEXTS[1]]}
        )
    assert response.status_code == 200, response.text
    got = np.array([item["embedding"] for item in response.json()["data"]])
    np.testing.assert_allclose(got[1:-1], expected_images, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(got[[0, -1]], expected_texts, atol=TOLERANCE, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_in_bf16_through_http(tmp_path):
    """Heads of 64 (the GPU backends'), up to 100 patches of 16 an image, through HTTP in bf16 (image
    batches eagerly, texts through graphs): each row at cosine >= 0.999 to transformers' fp32."""
    from api.config import EngineFlags

    tower = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2}
    folder, model = dual_encoder_checkpoint(
        tmp_path / "siglip2", "siglip2", tower, tower, image_size=160, patch_size=16, std=0.05
    )
    (expected_texts, expected_images), _ = reference(model, folder, TEXTS, pngs())
    parts = [{"type": "image_url", "image_url": {"url": data_uri(data)}} for data in pngs()]
    engine = EngineFlags("cuda", "bfloat16")
    config = ServerConfig(models=(str(folder),), served_model_names=(("siglip2",),), engine=engine)
    with TestClient(create_app(config)) as client:
        for _ in range(3):
            body = {"model": "siglip2", "input": [TEXTS[0], *parts, TEXTS[1]]}
            response = client.post("/v1/embeddings", json=body)
            assert response.status_code == 200, response.text
            got = np.array([item["embedding"] for item in response.json()["data"]])
            cosines = (got * np.concatenate([expected_texts[:1], expected_images, expected_texts[1:]])).sum(1)
            assert cosines.min() >= 0.999, cosines
