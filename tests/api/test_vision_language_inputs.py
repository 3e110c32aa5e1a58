"""Vision-language embedders (Qwen2-VL as gme-Qwen2-VL serves, Qwen3-VL as Qwen3-VL-Embedding does) through
HTTP on tiny random checkpoints: each input laid out as they lay out their own (a system turn, the user
turn of it, the assistant's prompt, then <|endoftext|>, pooled there), an image's placeholder repeated for
each token it takes; texts and images through OpenAI's `input` parts, Cohere v2's `images`, rerank and
TEI's /embed, each vector within 1e-5 of transformers' model on that layout and its own image processor;
bad inputs are 400s."""

import base64
import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from litestar.testing import TestClient
from PIL import Image

from api.app import create_app
from api.config import ServerConfig
from benchmarks.image_checkpoints import qwen2_vl_checkpoint

TOLERANCE = 1e-5
TEXTS = ["a photo of a cat", "two dogs on a beach"]
# each input as its embedders lay it out: gme-Qwen2-VL's (the chat template's default system turn) and
# Qwen3-VL-Embedding's (its own instruction)
LAYOUT = (
    "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{{}}<|im_end|>\n<|im_start|>assistant\n<|endoftext|>"
)
LAYOUTS = {
    "qwen2_vl": LAYOUT.format("You are a helpful assistant."),
    "qwen3_vl": LAYOUT.format("Represent the user's input."),
}


def png(height: int, width: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def data_uri(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


IMAGES = [png(50, 70, 1), png(90, 40, 2)]


def reference_vectors(model, folder, texts, images, layout):
    """transformers' last-token rows of the layout of each text, each PNG (its processor's pixels), then
    of the first PNG fused with the first text (the image, then the text, in one user turn)."""
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    processor = AutoImageProcessor.from_pretrained(folder)
    inputs = [
        {"input_ids": tokenizer.encode(layout.format(text), add_special_tokens=False).ids} for text in texts
    ]
    for data, after in [*((data, "") for data in images), (images[0], texts[0])]:
        pixels = processor(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
        grid = pixels["image_grid_thw"]
        pads = "<|image_pad|>" * int(grid.prod() // 4)
        text = layout.format(f"<|vision_start|>{pads}<|vision_end|>{after}")
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        inputs.append({"input_ids": ids, "pixel_values": pixels["pixel_values"], "image_grid_thw": grid})
    rows = []
    for one in inputs:
        ids = torch.tensor([one.pop("input_ids")])
        if one:
            one["mm_token_type_ids"] = (ids == model.config.image_token_id).int()
        with torch.inference_mode():
            rows.append(F.normalize(model.model(input_ids=ids, **one).last_hidden_state[0, -1], dim=-1))
    return torch.stack(rows).numpy()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def served(request, tmp_path_factory):
    kind = request.param
    folder, model = qwen2_vl_checkpoint(tmp_path_factory.mktemp(kind) / kind, kind=kind)
    expected = reference_vectors(model, folder, TEXTS, IMAGES, LAYOUTS[kind])
    config = ServerConfig(models=(str(folder),), served_model_names=(("gme",),), tokenizer_threads=2)
    with TestClient(create_app(config)) as client:
        yield client, expected


def vectors(payload) -> np.ndarray:
    return np.array([item["embedding"] for item in payload["data"]])


def test_texts_and_images_as_gme_lays_them_out(served):
    client, expected = served
    image = [{"type": "image_url", "image_url": {"url": data_uri(data)}} for data in IMAGES]
    response = client.post(
        "/v1/embeddings", json={"model": "gme", "input": [image[1], TEXTS[0], TEXTS[1], image[0]]}
    )
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(vectors(response.json()), expected[[3, 0, 1, 2]], atol=TOLERANCE, rtol=0)
    usage = response.json()["usage"]["prompt_tokens"]
    assert usage > 4 * 20  # each input's layout, an image's tokens included
    body = {"model": "gme", "images": [data_uri(data) for data in IMAGES], "input_type": "image"}
    response = client.post("/v2/embed", json={**body, "embedding_types": ["float"]})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["embeddings"]["float"], expected[2:4], atol=TOLERANCE, rtol=0)
    documents = [{"image": data_uri(IMAGES[0])}, TEXTS[1], {"image": data_uri(IMAGES[1])}]
    response = client.post("/v2/rerank", json={"model": "gme", "query": TEXTS[0], "documents": documents})
    assert response.status_code == 200, response.text
    got = {result["index"]: result["relevance_score"] for result in response.json()["results"]}
    scores = (1 + expected[[2, 1, 3]] @ expected[0]) / 2
    np.testing.assert_allclose([got[index] for index in range(3)], scores, atol=TOLERANCE, rtol=0)


def test_an_image_and_a_text_fused_into_one_vector(served):
    """Cohere v2's input of several content parts: one vector of the image, then the text, in one turn."""
    client, expected = served
    image = {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}
    inputs = [{"content": [image, {"type": "text", "text": TEXTS[0]}]}, {"content": [image]}]
    body = {"model": "gme", "inputs": inputs, "input_type": "search_document", "embedding_types": ["float"]}
    response = client.post("/v2/embed", json=body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(
        response.json()["embeddings"]["float"], expected[[4, 2]], atol=TOLERANCE, rtol=0
    )
    twice = {"content": [image, image]}
    response = client.post("/v2/embed", json={**body, "inputs": [twice]})
    assert response.status_code == 400 and "holds 2 images" in response.json()["message"], response.text


def test_texts_alone_are_laid_out_alike_on_every_route(served):
    client, expected = served
    response = client.post("/v1/embeddings", json={"model": "gme", "input": TEXTS})
    np.testing.assert_allclose(vectors(response.json()), expected[:2], atol=TOLERANCE, rtol=0)
    response = client.post("/embed", json={"inputs": TEXTS})
    np.testing.assert_allclose(response.json(), expected[:2], atol=TOLERANCE, rtol=0)


def test_bad_inputs_are_400s(served):
    client, _ = served
    response = client.post("/v1/embeddings", json={"model": "gme", "input": ["word " * 600]})
    assert response.status_code == 400 and "512" in response.json()["error"]["message"], response.text
    thin = {"type": "image_url", "image_url": {"url": data_uri(png(2, 600, 3))}}
    response = client.post("/v1/embeddings", json={"model": "gme", "input": [TEXTS[0], thin]})
    assert response.status_code == 400, response.text
    assert (
        "input[1]" in response.json()["error"]["message"]
        and "200 times" in response.json()["error"]["message"]
    )
    assert client.post("/v1/embeddings", json={"model": "gme", "input": TEXTS}).status_code == 200
