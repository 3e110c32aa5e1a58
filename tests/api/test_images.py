"""Images through HTTP (api/images.py, api/image_inputs.py) on a tiny random CLIP and SigLIP: OpenAI's
`input` parts and Cohere v2's `images` and `inputs`, each vector within 1e-5 of transformers' from the PNG a
client sent; SigLIP's texts padded as its processor pads them; two replica processes; and the bad images:
not an image, truncated, 100 megapixels, an unsupported format, a URL not allowed or too large, an image
to a text model: each a 400 naming the problem, and the server serves on."""

import base64
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from litestar.testing import TestClient
from PIL import Image

from api.app import create_app
from api.config import ServerConfig
from api.image_inputs import FusedInput, ImageInput, image_groups
from api.images import ImageLimits
from benchmarks.image_checkpoints import dual_encoder_checkpoint

TOLERANCE = 1e-5
TEXTS = ["a photo of a cat", "two dogs on a beach"]


def png(height: int, width: int, seed: int, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4}[mode]
    image = Image.fromarray(rng.integers(0, 256, (height, width, channels), dtype=np.uint8), mode)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def data_uri(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


IMAGES = [png(40, 50, 1), png(64, 32, 2), png(20, 20, 3, "RGBA")]


def reference_vectors(model, folder, texts, images, padding=None):
    """transformers' normalized features of the texts (each alone, padded as the model's processor pads
    them where it does) and of the PNGs (its processor's pixels)."""
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    if padding is not None:
        ids = [one + [padding[1]] * (padding[0] - len(one)) for one in ids]
    processor = AutoImageProcessor.from_pretrained(folder)
    pixels = processor(images=[Image.open(io.BytesIO(data)) for data in images], return_tensors="pt")

    def features(output):
        return output.pooler_output if hasattr(output, "pooler_output") else output

    with torch.inference_mode():
        text_rows = [features(model.get_text_features(input_ids=torch.tensor([one]))) for one in ids]
        image_rows = features(model.get_image_features(pixel_values=pixels["pixel_values"]))
    return F.normalize(torch.cat(text_rows), dim=-1).numpy(), F.normalize(image_rows, dim=-1).numpy()


@pytest.fixture(scope="module", params=["clip", "siglip"])
def served(request, tmp_path_factory):
    folder, model = dual_encoder_checkpoint(
        tmp_path_factory.mktemp(request.param) / request.param, request.param
    )
    padding = None
    if request.param == "siglip":
        text = model.config.text_config
        padding = (text.max_position_embeddings, text.pad_token_id)
    texts, images = reference_vectors(model, folder, TEXTS, IMAGES, padding)
    config = ServerConfig(models=(str(folder),), served_model_names=((request.param,),), tokenizer_threads=2)
    with TestClient(create_app(config)) as client:
        yield client, request.param, texts, images


def vectors(payload) -> np.ndarray:
    return np.array([item["embedding"] for item in payload["data"]])


def test_openai_input_parts_of_texts_and_images(served):
    client, name, texts, images = served
    parts = [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}, TEXTS[0]]
    parts += [{"type": "text", "text": TEXTS[1]}, {"type": "image_url", "image_url": data_uri(IMAGES[1])}]
    parts.append({"type": "image_url", "image_url": {"url": data_uri(IMAGES[2])}})
    response = client.post("/v1/embeddings", json={"model": name, "input": parts})
    assert response.status_code == 200, response.text
    expected = np.stack([images[0], texts[0], texts[1], images[1], images[2]])
    np.testing.assert_allclose(vectors(response.json()), expected, atol=TOLERANCE, rtol=0)
    # a plain text request of an image model: its text tower, the same vectors
    response = client.post("/v1/embeddings", json={"model": name, "input": TEXTS})
    np.testing.assert_allclose(vectors(response.json()), texts, atol=TOLERANCE, rtol=0)


def test_cohere_v2_images_and_inputs(served):
    client, name, texts, images = served
    body = {"model": name, "images": [data_uri(data) for data in IMAGES], "input_type": "image"}
    response = client.post("/v2/embed", json={**body, "embedding_types": ["float", "int8"]})
    assert response.status_code == 200, response.text
    payload = response.json()
    np.testing.assert_allclose(np.array(payload["embeddings"]["float"]), images, atol=TOLERANCE, rtol=0)
    assert len(payload["embeddings"]["int8"]) == len(IMAGES) and payload["texts"] == []
    inputs = [
        {"content": [{"type": "text", "text": TEXTS[1]}]},
        {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[2])}}]},
    ]
    response = client.post(
        "/v2/embed", json={"model": name, "inputs": inputs, "input_type": "search_document"}
    )
    assert response.status_code == 200, response.text
    got = np.array(response.json()["embeddings"]["float"])
    np.testing.assert_allclose(got, np.stack([texts[1], images[2]]), atol=TOLERANCE, rtol=0)


def huge_png() -> bytes:
    """A 100-megapixel PNG (one bit a pixel, so it is small on the wire)."""
    buffer = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(buffer, "PNG")
    return buffer.getvalue()


def sliver() -> bytes:
    """143 bytes of PNG, 20000x1 pixels: resized to CLIP's shorter side of 224 it would be 4.5M x 224."""
    buffer = io.BytesIO()
    Image.new("RGB", (20_000, 1)).save(buffer, "PNG")
    return buffer.getvalue()


def ppm() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PPM")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "source, needle",
    [
        (data_uri(b"this is not an image at all"), "not an image in a supported format"),
        (data_uri(IMAGES[0][: len(IMAGES[0]) // 2]), "truncated"),
        (data_uri(huge_png()), "megapixels"),
        (data_uri(sliver()), "more than 200 times the other"),
        (data_uri(ppm(), "x-portable-pixmap"), "supported format"),
        ("data:text/plain;base64,aGVsbG8=", "not an image"),
        ("data:image/png;base64,***", "base64"),
        ("data:image/png;base64" + "A" * 64, "must be base64"),  # no comma
        ("https://example.com/cat.png", "--allow-image-urls"),
    ],
)
def test_bad_images_are_400s_naming_the_problem(served, source, needle):
    client, name, texts, _ = served
    parts = [TEXTS[0], {"type": "image_url", "image_url": {"url": source}}]
    response = client.post("/v1/embeddings", json={"model": name, "input": parts})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert needle in error["message"] and error["param"] == "input", error
    response = client.post("/v2/embed", json={"model": name, "images": [data_uri(IMAGES[0]), source]})
    assert response.status_code == 400 and needle in response.json()["message"], response.text
    assert "images[1]" in response.json()["message"]
    # the server serves on
    response = client.post("/v1/embeddings", json={"model": name, "input": TEXTS})
    np.testing.assert_allclose(vectors(response.json()), texts, atol=TOLERANCE, rtol=0)


def test_bad_images_beside_good_requests_lose_nothing(served):
    """Requests with a corrupt image among many good ones in flight: each bad one a 400, each good one its
    own vectors."""
    client, name, texts, images = served
    good = {
        "model": name,
        "input": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}, TEXTS[0]],
    }
    bad_part = {"type": "image_url", "image_url": {"url": data_uri(IMAGES[1][:100])}}
    bad = {"model": name, "input": [TEXTS[1], bad_part]}
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda body: client.post("/v1/embeddings", json=body), [good, bad] * 8))
    for index, response in enumerate(responses):
        if index % 2:
            assert response.status_code == 400 and "truncated" in response.json()["error"]["message"]
        else:
            np.testing.assert_allclose(
                vectors(response.json()), np.stack([images[0], texts[0]]), atol=TOLERANCE
            )


def test_an_image_to_a_text_model_is_a_400(client):
    part = {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}
    response = client.post("/v1/embeddings", json={"input": ["a", part]})
    assert response.status_code == 400 and "embeds text only" in response.json()["error"]["message"]
    response = client.post("/v2/embed", json={"images": [data_uri(IMAGES[0])], "input_type": "image"})
    assert response.status_code == 400 and "embeds text only" in response.json()["message"]
    response = client.post("/v2/embed", json={"texts": ["a"], "input_type": "image"})
    assert response.status_code == 400 and "input_type" in response.json()["message"]
    # /pooling takes images for a multi-vector image model's token vectors only
    response = client.post("/pooling", json={"input": ["a", part]})
    assert response.status_code == 400 and "input[1] is an image" in response.json()["error"]["message"]
    response = client.post("/pooling", json={"input": ["a", {"type": "video"}]})
    assert response.status_code == 400 and "input[1] must be a part" in response.json()["error"]["message"]
    assert client.post("/v1/embeddings", json={"input": ["a"]}).status_code == 200


@pytest.fixture()
def image_host(tmp_path):
    """A local HTTP server of a small and a large image."""
    (tmp_path / "small.png").write_bytes(IMAGES[0])
    (tmp_path / "large.png").write_bytes(b"\0" * 300_000)
    server = HTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_image_urls_are_fetched_only_when_allowed_and_within_limits(tmp_path_factory, image_host):
    folder, model = dual_encoder_checkpoint(tmp_path_factory.mktemp("clip-urls") / "clip", "clip")
    _, expected = reference_vectors(model, folder, TEXTS[:1], IMAGES[:1])
    limits = ImageLimits(allow_urls=True, url_max_bytes=200_000)
    config = ServerConfig(models=(str(folder),), images=limits)
    with TestClient(create_app(config)) as client:
        part = {"type": "image_url", "image_url": {"url": f"{image_host}/small.png"}}
        response = client.post("/v1/embeddings", json={"input": [part]})
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(vectors(response.json()), expected, atol=TOLERANCE, rtol=0)
        for path, needle in (("large.png", "larger than 200000 bytes"), ("missing.png", "HTTP 404")):
            part = {"type": "image_url", "image_url": {"url": f"{image_host}/{path}"}}
            response = client.post("/v1/embeddings", json={"input": [part]})
            assert response.status_code == 400 and needle in response.json()["error"]["message"], (
                response.text
            )


def test_rerank_of_image_documents(served):
    """Images among rerank's documents, as Jina ({"image": ...}) and vLLM ({"content": [part]}) send them:
    each scores (1 + cosine) / 2 of its vector and the query's, as an embedding model's documents do."""
    client, name, texts, images = served
    documents = [
        {"image": data_uri(IMAGES[0])},
        TEXTS[1],
        {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[1])}}]},
        {"type": "image_url", "image_url": {"url": data_uri(IMAGES[2])}},
    ]
    for version in ("v1", "v2"):
        body = {"model": name, "query": TEXTS[0], "documents": documents, "return_documents": True}
        response = client.post(f"/{version}/rerank", json=body)
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        expected = (1 + np.stack([images[0], texts[1], images[1], images[2]]) @ texts[0]) / 2
        assert [result["index"] for result in results] == np.argsort(-expected, kind="stable").tolist()
        got = {result["index"]: result["relevance_score"] for result in results}
        np.testing.assert_allclose([got[index] for index in range(4)], expected, atol=TOLERANCE, rtol=0)
        assert results[0]["document"] == (
            documents[results[0]["index"]] if results[0]["index"] != 1 else {"text": TEXTS[1]}
        )
    bad = [*documents[:1], {"image": data_uri(b"not an image")}]
    response = client.post("/v2/rerank", json={"model": name, "query": "q", "documents": bad})
    assert response.status_code == 400 and "documents[1]" in response.json()["message"], response.text


def test_rerank_cuts_text_documents_to_max_tokens_per_doc(served):
    """Cohere v2's max_tokens_per_doc cuts a text document to its first tokens beside the images, as
    /v1/embeddings' truncate_prompt_tokens of as many content tokens does; the query keeps its window."""
    client, name, texts, images = served
    long_text = "a photo of a cat asleep in the sun on a mat by the door"
    cut = 3
    layout = 2 if name == "clip" else 1  # CLIP's start and end of text; SigLIP's end of sequence
    body = {"model": name, "input": [long_text], "truncate_prompt_tokens": cut + layout}
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    cut_vector = np.array(response.json()["data"][0]["embedding"])
    documents = [long_text, {"image": data_uri(IMAGES[0])}]
    body = {"model": name, "query": TEXTS[0], "documents": documents, "max_tokens_per_doc": cut}
    response = client.post("/v2/rerank", json=body)
    assert response.status_code == 200, response.text
    got = {result["index"]: result["relevance_score"] for result in response.json()["results"]}
    expected = (1 + np.stack([cut_vector, images[0]]) @ texts[0]) / 2
    np.testing.assert_allclose([got[0], got[1]], expected, atol=TOLERANCE, rtol=0)


def test_rerank_of_an_image_query(served):
    """An image as the query ({"image": ...} or {"content": [part]}) against texts and images: (1 +
    cosine) / 2 of its vector and each document's; a query object of neither shape is a 400."""
    client, name, texts, images = served
    documents = [TEXTS[0], {"image": data_uri(IMAGES[1])}, TEXTS[1]]
    expected = (1 + np.stack([texts[0], images[1], texts[1]]) @ images[0]) / 2
    queries = [
        {"image": data_uri(IMAGES[0])},
        {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}]},
    ]
    for query in queries:
        response = client.post("/v2/rerank", json={"model": name, "query": query, "documents": documents})
        assert response.status_code == 200, response.text
        got = {result["index"]: result["relevance_score"] for result in response.json()["results"]}
        np.testing.assert_allclose([got[index] for index in range(3)], expected, atol=TOLERANCE, rtol=0)
    for query, needle in (({"url": "x"}, "query must be a string"), ({"image": "nope"}, "query: ")):
        response = client.post("/v2/rerank", json={"model": name, "query": query, "documents": documents})
        assert response.status_code == 400 and needle in response.json()["message"], response.text


def test_a_dual_encoder_refuses_fused_inputs(served):
    client, name, _, _ = served
    parts = [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}, {"type": "text", "text": "a"}]
    body = {
        "model": name,
        "inputs": [{"content": parts}],
        "input_type": "image",
        "embedding_types": ["float"],
    }
    response = client.post("/v2/embed", json=body)
    assert response.status_code == 400 and "embeds each part alone" in response.json()["message"], (
        response.text
    )


def test_a_text_ranker_refuses_image_documents(client):
    documents = ["a", {"image": data_uri(IMAGES[0])}]
    response = client.post("/v2/rerank", json={"query": "q", "documents": documents})
    assert response.status_code == 400 and "documents[1] is an image" in response.json()["message"]
    response = client.post("/v2/rerank", json={"query": {"image": data_uri(IMAGES[0])}, "documents": ["a"]})
    assert response.status_code == 400 and "query is an image" in response.json()["message"]
    assert response.json()["message"].count("ranks text only") == 1


def test_a_requests_images_go_to_the_engine_in_groups_of_what_the_threads_decode_at_once():
    """Each group holds at most the image threads' count of images (an input of more alone), in order,
    each text with the images beside it, so that the engine runs a group while the next is decoded."""
    image = [ImageInput(f"data:{index}", f"input[{index}]") for index in range(6)]
    fused = FusedInput((image[3], "a caption", image[4], image[5]), "input[7]")
    items = ["a", image[0], image[1], "b", image[2], fused, "c"]
    assert image_groups(items, 2) == [["a", image[0], image[1], "b"], [image[2]], [fused, "c"]]
    assert image_groups(items, 3) == [["a", image[0], image[1], "b", image[2]], [fused, "c"]]
    assert image_groups(items, 6) == [items]
    assert image_groups(items, 0) == [items]  # a model without image threads
    assert image_groups(["a", "b"], 1) == [["a", "b"]]


def test_more_images_than_threads_keep_their_order_and_vectors(served):
    """Seven images and texts on the server's two image threads (four groups, run at once): each vector
    transformers' for its input, in the request's order."""
    client, name, texts, images = served
    order = [0, 1, 2, 2, 1, 0, 1]
    parts = [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[index])}} for index in order]
    parts.insert(3, TEXTS[0])
    response = client.post("/v1/embeddings", json={"model": name, "input": parts})
    assert response.status_code == 200, response.text
    expected = np.stack([images[index] for index in order[:3]] + [texts[0]] + [images[i] for i in order[3:]])
    np.testing.assert_allclose(vectors(response.json()), expected, atol=TOLERANCE, rtol=0)
    tokens = response.json()["usage"]["prompt_tokens"]
    assert float(response.headers["x-tokenization-time"]) <= float(response.headers["x-total-time"])
    assert tokens > 0


def test_a_text_too_long_among_images_is_named_by_its_place_in_the_request(served):
    """Its index among the request's inputs, not among its texts or its group's (three images on two
    threads: the text is in the second group)."""
    client, name, _, _ = served
    parts = [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[index])}} for index in range(3)]
    for place in (3, 1):
        given = [*parts[:place], "word " * 3000, *parts[place:]]
        response = client.post("/v1/embeddings", json={"model": name, "input": given})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"].startswith(f"input {place} has "), response.text
