"""The official openai SDK against a live server: /v1/embeddings (and /embeddings) and /v1/models."""

from __future__ import annotations

import re

import numpy as np
import openai
import pytest

from .contract import (
    DIM,
    MAX_INPUTS,
    MODEL,
    MODEL_ALIAS,
    SAME_VECTOR,
    VOCAB_SIZE,
    WINDOW,
    cosine,
    decode_base64,
    words,
)

TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell today."]


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=120.0)


@pytest.fixture(scope="module")
def client(base_url):
    with sdk(base_url) as client:
        yield client


@pytest.fixture(scope="module")
def ids_client(server_factory):
    """A server that takes token ids (--accept-token-ids): the bundled model's own."""
    with sdk(server_factory("--accept-token-ids").url) as client:
        yield client


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def assert_sdk_error_shape(error: openai.APIStatusError) -> str:
    body = error.response.json()["error"]
    assert {"message", "type", "param", "code"} <= body.keys(), body
    assert isinstance(body["message"], str) and body["message"]
    return body["message"]


def test_string_input_with_sdk_default_base64(client, embed):
    response = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert response.object == "list"
    assert response.model == MODEL
    assert [(item.object, item.index) for item in response.data] == [("embedding", 0)]
    vector = vectors(response)[0]
    assert vector.shape == (DIM,)
    assert cosine(vector, embed(TEXTS[0])[0]) >= SAME_VECTOR


def test_list_of_strings_in_input_order(client):
    response = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [item.index for item in response.data] == [0, 1, 2]
    batch = vectors(response)
    for index, text in enumerate(TEXTS):
        alone = vectors(client.embeddings.create(model=MODEL, input=text, encoding_format="float"))[0]
        assert cosine(batch[index], alone) >= SAME_VECTOR, text


def test_token_ids_are_refused_by_default_with_the_way_out(client, tokenizer):
    for inputs in (tokenizer.encode(TEXTS[0]).ids, [tokenizer.encode(text).ids for text in TEXTS]):
        with pytest.raises(openai.BadRequestError) as raised:
            client.embeddings.create(model=MODEL, input=inputs)
        message = assert_sdk_error_shape(raised.value)
        assert "check_embedding_ctx_length=False" in message and "--accept-token-ids" in message


def test_token_ids_equal_text(ids_client, tokenizer, embed):
    ids = tokenizer.encode(TEXTS[0]).ids
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]: the server must add nothing
    response = ids_client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert len(response.data) == 1
    assert response.usage.prompt_tokens == len(ids)
    assert cosine(vectors(response)[0], embed(TEXTS[0])[0]) >= SAME_VECTOR


def test_token_id_lists_equal_texts(ids_client, tokenizer, embed):
    id_lists = [tokenizer.encode(text).ids for text in TEXTS]
    response = ids_client.embeddings.create(model=MODEL, input=id_lists, encoding_format="float")
    assert [item.index for item in response.data] == [0, 1, 2]
    assert response.usage.prompt_tokens == sum(len(ids) for ids in id_lists)
    for from_ids, from_text in zip(vectors(response), embed(TEXTS)):
        assert cosine(from_ids, from_text) >= SAME_VECTOR


def test_float_and_base64_give_same_vectors(client):
    as_float = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    as_base64 = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")
    for float_item, base64_item in zip(as_float.data, as_base64.data):
        assert isinstance(base64_item.embedding, str)
        decoded = decode_base64(base64_item.embedding)
        assert decoded.shape == (DIM,)
        np.testing.assert_allclose(decoded, np.array(float_item.embedding, dtype=np.float32), atol=1e-6)


def test_dimensions_truncates_and_renormalizes(client):
    full = vectors(client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float"))
    short = vectors(client.embeddings.create(model=MODEL, input=TEXTS, dimensions=64))
    assert short.shape == (len(TEXTS), 64)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-4)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-4)


def test_dimensions_equal_to_model_size_is_accepted(client, embed):
    response = client.embeddings.create(model=MODEL, input=TEXTS[1], dimensions=DIM)
    assert cosine(vectors(response)[0], embed(TEXTS[1])[0]) >= SAME_VECTOR


@pytest.mark.parametrize("dimensions", [DIM + 1, 0])
def test_dimensions_out_of_range_is_bad_request(client, dimensions):
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=dimensions)
    assert_sdk_error_shape(raised.value)


def test_usage_counts_tokens_with_special_tokens(client, count_tokens):
    texts = [*TEXTS, "a", words(40, "tokenization")]
    response = client.embeddings.create(model=MODEL, input=texts)
    assert response.usage.prompt_tokens == sum(count_tokens(text) for text in texts)
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_vectors_have_unit_norm(client):
    texts = ["a", *TEXTS, words(200, "norm")]
    norms = np.linalg.norm(vectors(client.embeddings.create(model=MODEL, input=texts)), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-4)


def test_semantic_sanity(client):
    guitar, instrument, market = vectors(client.embeddings.create(model=MODEL, input=TEXTS))
    assert cosine(guitar, instrument) > cosine(guitar, market) + 0.1


def test_alias_is_served_and_echoed(client, embed):
    response = client.embeddings.create(model=MODEL_ALIAS, input=TEXTS[2])
    assert response.model == MODEL_ALIAS
    assert cosine(vectors(response)[0], embed(TEXTS[2])[0]) >= SAME_VECTOR


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as raised:
        client.embeddings.create(model="no-such-model", input=TEXTS[0])
    assert_sdk_error_shape(raised.value)


@pytest.mark.parametrize(
    "inputs",
    [
        pytest.param("", id="empty-string"),
        pytest.param([], id="empty-list"),
        pytest.param(["fine", ""], id="empty-string-in-list"),
        pytest.param(["short text"] * (MAX_INPUTS + 1), id="too-many-inputs"),
    ],
)
def test_bad_input_is_bad_request(client, inputs):
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, input=inputs)
    assert_sdk_error_shape(raised.value)


@pytest.mark.parametrize(
    "inputs",
    [
        pytest.param([101, VOCAB_SIZE, 102], id="token-id-above-vocabulary"),
        pytest.param([[101, 2054, 102], [101, -1, 102]], id="negative-token-id"),
        pytest.param([[101, 2054, 102], []], id="empty-token-id-list"),
    ],
)
def test_bad_token_ids_are_bad_request_where_ids_are_taken(ids_client, inputs):
    with pytest.raises(openai.BadRequestError) as raised:
        ids_client.embeddings.create(model=MODEL, input=inputs)
    assert "vocabulary" in assert_sdk_error_shape(raised.value) or "empty" in str(raised.value)


def test_over_long_input_names_both_counts(client, count_tokens):
    text = words(300)
    num_tokens = count_tokens(text)
    assert num_tokens > WINDOW
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, input=["fine", text])
    message = assert_sdk_error_shape(raised.value)
    assert re.search(rf"\b{num_tokens}\b", message), message
    assert re.search(rf"\b{WINDOW}\b", message), message


@pytest.mark.parametrize("truncate_prompt_tokens", [-1, 100])
def test_truncate_prompt_tokens_accepts_over_long_input(client, embed, truncate_prompt_tokens):
    kept_tokens = WINDOW if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    response = client.embeddings.create(
        model=MODEL, input=words(300), extra_body={"truncate_prompt_tokens": truncate_prompt_tokens}
    )
    assert response.usage.prompt_tokens == kept_tokens
    expected = embed(words(kept_tokens - 2))[0]  # the same kept tokens, whichever side was cut
    assert cosine(vectors(response)[0], expected) >= SAME_VECTOR


def test_optional_and_unknown_fields_are_accepted(client, embed):
    response = client.embeddings.create(
        model=MODEL,
        input=TEXTS[0],
        user="user-1",
        extra_body={"input_type": "document", "a_field_from_the_future": {"x": 1}},
    )
    assert cosine(vectors(response)[0], embed(TEXTS[0])[0]) >= SAME_VECTOR


def test_models_list(client):
    models = list(client.models.list())
    ids = [model.id for model in models]
    assert MODEL in ids
    assert len(ids) == len(set(ids))
    for model in models:
        assert model.object == "model"
        assert model.owned_by == "posy"
        assert isinstance(model.created, int)


def test_embeddings_route_without_v1_prefix(base_url, embed):
    with openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=120.0) as client:
        response = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert cosine(vectors(response)[0], embed(TEXTS[0])[0]) >= SAME_VECTOR
