"""/v2/embed (Cohere's embed v2) on the bundled model: every embedding type against the float vectors
under api/quantize.py's rules, truncation from either end, output_dimension, billing and errors."""

import base64

import numpy as np
import pytest

TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell today."]
MODEL = "all-MiniLM-L6-v2"


def embed_v2(client, **body) -> dict:
    response = client.post("/v2/embed", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


def openai_vectors(client, inputs, **fields) -> np.ndarray:
    response = client.post("/v1/embeddings", json={"model": MODEL, "input": inputs, **fields})
    assert response.status_code == 200, response.text
    return np.array([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def test_float_is_the_openai_routes_vectors_and_the_default_type(client):
    payload = embed_v2(client, texts=TEXTS, input_type="search_document")
    assert payload["response_type"] == "embeddings_by_type" and payload["texts"] == TEXTS
    assert list(payload["embeddings"]) == ["float"]
    np.testing.assert_allclose(payload["embeddings"]["float"], openai_vectors(client, TEXTS), atol=1e-6)
    usage = client.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS}).json()["usage"]
    assert payload["meta"]["billed_units"]["input_tokens"] == usage["prompt_tokens"]
    assert payload["meta"]["api_version"]["version"] == "2"


def test_every_embedding_type_follows_the_documented_quantization(client):
    kinds = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    embeddings = embed_v2(client, texts=TEXTS, embedding_types=kinds)["embeddings"]
    assert sorted(embeddings) == sorted(kinds)
    floats = np.array(embeddings["float"], dtype=np.float32)
    int8 = np.array(embeddings["int8"])
    # int8: round(127 x / max|x|) per vector, so the largest component is +-127
    assert int8.min() >= -127 and int8.max() <= 127 and (np.abs(int8).max(axis=1) == 127).all()
    assert np.abs(int8 - 127 * floats / np.abs(floats).max(axis=1, keepdims=True)).max() <= 0.5 + 1e-4
    cosine = (int8 * floats).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(floats, axis=1)
    assert cosine.min() > 0.999
    assert (np.array(embeddings["uint8"]) == int8 + 128).all()
    # binary: the sign bits, packed most significant first; ubinary as uint8, binary as uint8 - 128
    ubinary = np.array(embeddings["ubinary"], dtype=np.uint8)
    assert ubinary.shape == (3, 384 // 8)
    assert (np.unpackbits(ubinary, axis=1) == (floats > 0)).all()
    assert (np.array(embeddings["binary"]) == ubinary.astype(int) - 128).all()
    decoded = np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in embeddings["base64"]])
    assert np.array_equal(decoded, floats)


def test_truncation_keeps_the_start_or_the_end(client, minilm_tokenizer):
    long_text = " ".join(f"word{index}" for index in range(400))
    rejected = client.post("/v2/embed", json={"texts": [long_text], "truncate": "NONE"})
    assert rejected.status_code == 400 and "message" in rejected.json()
    content = minilm_tokenizer.encode(long_text, add_special_tokens=False).ids
    cls, sep = minilm_tokenizer.token_to_id("[CLS]"), minilm_tokenizer.token_to_id("[SEP]")
    room = 256 - 2
    for truncate, kept in (("END", content[:room]), ("START", content[-room:])):
        ours = np.array(embed_v2(client, texts=[long_text], truncate=truncate)["embeddings"]["float"])
        expected = openai_vectors(client, [[cls, *kept, sep]])
        np.testing.assert_allclose(ours, expected, atol=1e-6)
    assert embed_v2(client, texts=[long_text])["meta"]["billed_units"]["input_tokens"] == 256  # END


def test_inputs_of_text_content_embed_as_texts(client):
    """Cohere's v2 `inputs` (the SDK's `inputs=[{"content": [{"type": "text", "text": ...}]}]`)."""
    inputs = [{"content": [{"type": "text", "text": text}]} for text in TEXTS]
    payload = embed_v2(client, inputs=inputs, embedding_types=["float", "int8"])
    expected = embed_v2(client, texts=TEXTS, embedding_types=["float", "int8"])
    assert payload["embeddings"] == expected["embeddings"] and payload["texts"] == TEXTS
    assert payload["meta"]["billed_units"] == expected["meta"]["billed_units"]


def test_output_dimension_and_max_tokens(client):
    short = np.array(embed_v2(client, texts=TEXTS, output_dimension=128)["embeddings"]["float"])
    np.testing.assert_allclose(short, openai_vectors(client, TEXTS, dimensions=128), atol=1e-6)
    capped = embed_v2(client, texts=TEXTS, max_tokens=4)
    assert capped["meta"]["billed_units"]["input_tokens"] == 3 * 4


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"texts": []}, "texts"),
        ({"texts": ["ok", ""]}, "texts[1]"),
        ({"texts": ["ok"], "embedding_types": ["float", "int4"]}, "int4"),
        ({"texts": ["ok"], "output_dimension": 1000}, "output_dimension"),
        ({"texts": ["ok"], "input_type": "image"}, "input_type"),
        ({"images": ["data:image/png;base64,AAAA"]}, "text only"),
        ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "inputs[0]"),
        ({"inputs": [{"content": [{"type": "text", "text": "a"}] * 2}]}, "embeds each part alone"),
        ({"inputs": [{"content": [{"type": "text", "text": ""}]}]}, "inputs[0]"),
        ({"inputs": []}, "inputs"),
        ({"texts": ["ok"], "inputs": [{"content": [{"type": "text", "text": "a"}]}]}, "one of texts"),
        ({"texts": ["ok"], "truncate": "MIDDLE"}, "truncate"),
        ({"texts": ["ok"], "model": "no-such-model"}, "no-such-model"),
    ],
)
def test_bad_requests_get_a_400_in_coheres_shape(client, body, param):
    response = client.post("/v2/embed", json=body)
    assert response.status_code in (400, 404), response.text
    assert set(response.json()) == {"message"} and param in response.json()["message"]
