"""text-embeddings-inference's /embed, /tokenize and /info on the bundled model: TEI's shapes, the same
vectors as the OpenAI route, truncation from either side, and TEI's error shape."""

import numpy as np
import pytest

TEXTS = ["A man is playing a guitar.", "Someone plays an instrument."]


def openai_vectors(client, inputs, **fields) -> np.ndarray:
    response = client.post("/v1/embeddings", json={"input": inputs, **fields})
    assert response.status_code == 200, response.text
    return np.array([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def test_embed_returns_a_bare_list_of_the_openai_routes_vectors(client):
    response = client.post("/embed", json={"inputs": TEXTS})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(np.array(response.json()), openai_vectors(client, TEXTS), atol=1e-6)
    single = client.post("/embed", json={"inputs": TEXTS[0], "dimensions": 64}).json()
    np.testing.assert_allclose(single, openai_vectors(client, TEXTS[:1], dimensions=64), atol=1e-6)


def test_embed_truncates_on_the_side_asked(client, minilm_tokenizer):
    long_text = " ".join(f"word{index}" for index in range(400))
    refused = client.post("/embed", json={"inputs": long_text})
    assert refused.status_code == 413 or refused.status_code == 422, refused.text
    assert refused.json()["error_type"] == "Validation"
    content = minilm_tokenizer.encode(long_text, add_special_tokens=False).ids
    cls, sep = minilm_tokenizer.token_to_id("[CLS]"), minilm_tokenizer.token_to_id("[SEP]")
    for direction, kept in (("Right", content[:254]), ("Left", content[-254:])):
        body = {"inputs": long_text, "truncate": True, "truncation_direction": direction}
        ours = client.post("/embed", json=body).json()
        np.testing.assert_allclose(ours, openai_vectors(client, [[cls, *kept, sep]]), atol=1e-6)


def test_embed_normalize_false_on_a_normalizing_model_is_refused_in_teis_shape(client):
    response = client.post("/embed", json={"inputs": TEXTS, "normalize": False})
    assert response.status_code == 422
    assert response.json()["error_type"] == "Validation" and "normalize" in response.json()["error"]


def test_tokenize_gives_ids_texts_offsets_and_specials(client, minilm_tokenizer):
    text = "Hello, world!"
    tokens = client.post("/tokenize", json={"inputs": text}).json()[0]
    assert [token["id"] for token in tokens] == minilm_tokenizer.encode(text).ids
    assert tokens[0] == {"id": tokens[0]["id"], "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[-1]["special"] and tokens[-1]["text"] == "[SEP]"
    for token in tokens[1:-1]:
        assert not token["special"] and token["text"] == text[token["start"] : token["stop"]]
    bare = client.post("/tokenize", json={"inputs": [text, "x"], "add_special_tokens": False}).json()
    assert len(bare) == 2 and [token["id"] for token in bare[0]] == [token["id"] for token in tokens[1:-1]]


def test_info_describes_the_served_model(client):
    info = client.get("/info").json()
    assert info["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] == 2048
    assert info["model_dtype"] == "float32" and info["max_batch_tokens"] >= 256
    assert info["version"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"inputs": []}),
        ("/embed", {"inputs": ["ok", ""]}),
        ("/embed", {"inputs": "ok", "dimensions": 1000}),
        ("/embed", {"inputs": "ok", "truncation_direction": "Up"}),
        ("/tokenize", {"inputs": []}),
        ("/tokenize", {"text": "wrong field"}),
    ],
)
def test_bad_requests_get_teis_error_shape(client, path, body):
    response = client.post(path, json=body)
    assert response.status_code in (413, 422), response.text
    assert set(response.json()) == {"error", "error_type"}
