"""/v1/embeddings on the bundled model: input kinds, encodings, dimensions, usage, truncation."""

import base64

import numpy as np
import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig

TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell today."]


def embed(client, **body) -> dict:
    response = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", **body})
    assert response.status_code == 200, response.text
    return response.json()


def vectors(payload: dict) -> np.ndarray:
    rows = []
    for index, item in enumerate(payload["data"]):
        assert item["index"] == index and item["object"] == "embedding"
        value = item["embedding"]
        rows.append(np.frombuffer(base64.b64decode(value), dtype="<f4") if isinstance(value, str) else value)
    return np.asarray(rows, dtype=np.float32)


def test_string_and_list_inputs_give_unit_vectors_in_input_order(client):
    single = vectors(embed(client, input=TEXTS[0]))
    batch = vectors(embed(client, input=TEXTS))
    assert single.shape == (1, 384) and batch.shape == (3, 384)
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    assert float(single[0] @ batch[0]) > 0.9999
    similar, unrelated = batch[0] @ batch[1], batch[0] @ batch[2]
    assert similar > unrelated + 0.2


def test_base64_is_little_endian_float32_of_the_same_vectors(client):
    floats = vectors(embed(client, input=TEXTS, encoding_format="float"))
    packed = vectors(embed(client, input=TEXTS, encoding_format="base64"))
    assert np.array_equal(floats, packed)


def test_token_id_inputs_are_the_same_as_text(client, minilm_tokenizer):
    ids = [minilm_tokenizer.encode(text).ids for text in TEXTS]
    from_text = vectors(embed(client, input=TEXTS))
    from_lists = vectors(embed(client, input=ids))
    from_one_list = vectors(embed(client, input=ids[0]))
    assert np.allclose(from_text, from_lists, atol=1e-5)
    assert np.allclose(from_text[0], from_one_list[0], atol=1e-5)


def test_token_ids_are_refused_with_the_way_out_unless_the_server_takes_them(minilm_tokenizer):
    # LangChain's OpenAIEmbeddings sends tiktoken's ids by default: in the vocabulary, and other text
    ids = [minilm_tokenizer.encode(text).ids for text in TEXTS]
    with TestClient(create_app(ServerConfig())) as default:
        for value in (ids, ids[0]):
            response = default.post("/v1/embeddings", json={"input": value})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == "input"
            message = error["message"]
            assert "check_embedding_ctx_length=False" in message and "--accept-token-ids" in message
        assert vectors(embed(default, input=TEXTS)).shape == (3, 384)  # and it keeps serving


def test_usage_counts_tokens_with_special_tokens(client, minilm_tokenizer):
    payload = embed(client, input=TEXTS)
    expected = sum(len(minilm_tokenizer.encode(text).ids) for text in TEXTS)
    assert payload["usage"] == {"prompt_tokens": expected, "total_tokens": expected}
    assert payload["model"] == "all-MiniLM-L6-v2" and payload["object"] == "list"


def test_dimensions_truncates_then_renormalizes(client):
    full = vectors(embed(client, input=TEXTS))
    short = vectors(embed(client, input=TEXTS, dimensions=64))
    assert short.shape == (3, 64)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    assert np.allclose(short, expected, atol=1e-6)
    assert np.array_equal(vectors(embed(client, input=TEXTS, dimensions=384)), full)


def test_truncate_prompt_tokens_keeps_the_start(client, minilm_tokenizer):
    long_text = "alpha beta gamma " * 200
    truncated = vectors(embed(client, input=long_text, truncate_prompt_tokens=-1))
    ids = minilm_tokenizer.encode(long_text).ids
    expected = vectors(embed(client, input=[ids[:255] + [ids[-1]]]))
    assert float(truncated[0] @ expected[0]) > 0.9999
    payload = embed(client, input=long_text, truncate_prompt_tokens=10)
    assert payload["usage"]["prompt_tokens"] == 10


def test_unknown_fields_and_input_type_are_accepted(client):
    plain = vectors(embed(client, input=TEXTS[0]))
    typed = vectors(embed(client, input=TEXTS[0], input_type="search_query", user="u", foo={"bar": 1}))
    # all-MiniLM-L6-v2 has no prompts: a query is embedded as is
    assert np.array_equal(plain, typed)


def test_models_lists_every_name(client):
    payload = client.get("/v1/models").json()
    assert payload["object"] == "list"
    assert {model["id"] for model in payload["data"]} == {
        "sentence-transformers/all-MiniLM-L6-v2",
        "all-MiniLM-L6-v2",
    }


@pytest.mark.parametrize("path", ["/health", "/ready"])
def test_health_and_ready(client, path):
    assert client.get(path).status_code == 200


def test_metrics_expose_requests_latency_queue_and_batches(client):
    embed(client, input=TEXTS)
    text = client.get("/metrics").text
    assert 'posy_requests_total{route="/v1/embeddings",status="200"}' in text
    assert "posy_request_duration_seconds_bucket" in text
    assert 'posy_queued_tokens{model="sentence-transformers/all-MiniLM-L6-v2"}' in text
    assert "posy_batch_tokens_bucket" in text and "posy_batch_sequences_bucket" in text


def test_float_vectors_are_written_in_float32s_shortest_form_and_read_back_exactly():
    import json

    import msgspec

    from api.quantize import float_json, float_rows

    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((4, 64)).astype(np.float32)
    strided = matrix[:, ::2]  # not contiguous: written all the same
    for vectors in (matrix, strided):
        written = msgspec.json.encode(float_rows(vectors))
        assert np.array_equal(np.asarray(json.loads(written), dtype=np.float32), vectors)
    as_float64 = msgspec.json.encode(matrix.tolist())
    assert len(msgspec.json.encode(float_rows(matrix))) < 0.7 * len(as_float64)
    assert json.loads(msgspec.json.encode(float_rows(np.array([[0.1]], dtype=np.float32)))) == [[0.1]]
    token_vectors = msgspec.json.encode(float_json(strided))  # a matrix, row by row
    assert np.array_equal(np.asarray(json.loads(token_vectors), dtype=np.float32), strided)
