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
from litestar.testing import TestClient
from PIL import Image

from api.app import create_app
from api.config import ServerConfig
from benchmarks.image_checkpoints import EMBEDDER_LAYOUTS, embedder_vectors, vision_language_checkpoint

TOLERANCE = 1e-5
TEXTS = ["a photo of a cat", "two dogs on a beach"]


def png(height: int, width: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def data_uri(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


IMAGES = [png(50, 70, 1), png(90, 40, 2)]


@pytest.fixture(scope="module", params=list(EMBEDDER_LAYOUTS))
def served(request, tmp_path_factory):
    kind = request.param
    folder, model = vision_language_checkpoint(tmp_path_factory.mktemp(kind) / kind, kind=kind)
    layout = EMBEDDER_LAYOUTS[kind]
    fused = [(IMAGES[0], TEXTS[0]), (IMAGES[1], TEXTS[1], IMAGES[0])]
    expected = embedder_vectors(model, folder, layout, TEXTS, IMAGES, fused)
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
    """Cohere v2's input of several content parts: one vector of its images and texts, in order, one turn."""
    client, expected = served
    image = {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}
    inputs = [{"content": [image, {"type": "text", "text": TEXTS[0]}]}, {"content": [image]}]
    body = {"model": "gme", "inputs": inputs, "input_type": "search_document", "embedding_types": ["float"]}
    response = client.post("/v2/embed", json=body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(
        response.json()["embeddings"]["float"], expected[[4, 2]], atol=TOLERANCE, rtol=0
    )
    # a text part may not spell the image placeholder (no image would fill it): a 400 naming the input
    spelled = {"content": [image, {"type": "text", "text": "a <|image_pad|> cat"}]}
    response = client.post("/v2/embed", json={**body, "inputs": [spelled]})
    assert response.status_code == 400 and "inputs[0] holds a token" in response.json()["message"], (
        response.text
    )
    # several images among its texts, each where it stands
    parts = [
        {"type": "image_url", "image_url": {"url": data_uri(IMAGES[1])}},
        {"type": "text", "text": TEXTS[1]},
    ]
    response = client.post("/v2/embed", json={**body, "inputs": [{"content": [*parts, image]}]})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["embeddings"]["float"], expected[[5]], atol=TOLERANCE, rtol=0)


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


@pytest.mark.parametrize("kind", list(EMBEDDER_LAYOUTS))
def test_a_prompt_is_the_system_turn_of_texts_and_images(tmp_path, kind):
    """A vision-language embedder's prompt (its sentence-transformers prompts, by input_type or
    prompt_name) is the system turn of each input, text or image, as sentence-transformers gives a message
    model's prompt: the same vectors as transformers' on that layout; without one, the default turn."""
    import json

    from benchmarks.image_checkpoints import EMBEDDER_LAYOUT

    folder, model = vision_language_checkpoint(tmp_path / kind, kind=kind)
    instruction = "Find the picture of the animal."
    prompts = {"query": instruction, "document": ""}
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    expected = embedder_vectors(model, folder, EMBEDDER_LAYOUT.format(instruction), TEXTS[:1], IMAGES[:1])
    plain = embedder_vectors(model, folder, EMBEDDER_LAYOUTS[kind], TEXTS[:1], IMAGES[:1])
    assert np.abs(expected - plain).max() > 100 * TOLERANCE  # the turn matters: the test can fail
    image = {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}
    config = ServerConfig(models=(str(folder),), served_model_names=(("gme",),), tokenizer_threads=2)
    with TestClient(create_app(config)) as client:
        for body in ({"input_type": "query"}, {"prompt_name": "query"}):
            response = client.post(
                "/v1/embeddings", json={"model": "gme", "input": [TEXTS[0], image], **body}
            )
            assert response.status_code == 200, response.text
            np.testing.assert_allclose(vectors(response.json()), expected, atol=TOLERANCE, rtol=0)
        response = client.post("/embed", json={"inputs": TEXTS[:1], "prompt_name": "query"})  # TEI's
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json(), expected[:1], atol=TOLERANCE, rtol=0)
        response = client.post("/v1/embeddings", json={"model": "gme", "input": [TEXTS[0], image]})
        np.testing.assert_allclose(vectors(response.json()), plain, atol=TOLERANCE, rtol=0)
        # TEI's rerank and vLLM's score lay texts out as /v2/rerank does
        body = {"model": "gme", "query": TEXTS[0], "documents": TEXTS}
        v2 = client.post("/v2/rerank", json=body).json()["results"]
        v2 = [score for _, score in sorted((item["index"], item["relevance_score"]) for item in v2)]
        assert v2[0] == pytest.approx((1 + expected[0] @ plain[0]) / 2, abs=TOLERANCE)
        tei = client.post("/rerank", json={"query": TEXTS[0], "texts": TEXTS}).json()
        np.testing.assert_allclose(
            [item["score"] for item in sorted(tei, key=lambda item: item["index"])], v2
        )
        score = client.post("/score", json={"model": "gme", "text_1": TEXTS[0], "text_2": TEXTS}).json()
        np.testing.assert_allclose(
            [item["score"] for item in score["data"]], [2 * one - 1 for one in v2], atol=1e-6
        )
        # rerank: the query in its prompt's turn, each document in the document prompt's (none: the default)
        response = client.post(
            "/v2/rerank",
            json={"model": "gme", "query": TEXTS[0], "documents": [{"image": data_uri(IMAGES[0])}]},
        )
        assert response.status_code == 200, response.text
        score = response.json()["results"][0]["relevance_score"]
        assert score == pytest.approx((1 + expected[0] @ plain[1]) / 2, abs=TOLERANCE)
