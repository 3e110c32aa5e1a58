"""/v1/embeddings in Perplexity's shape (tiny pplx-embed checkpoints): base64_int8 (the default for a model
that quantizes natively: its own round(127 tanh x)) and base64_binary (sign bits, least significant first),
`dimensions` cutting without re-normalizing, Perplexity's usage cost; float and base64 still the raw vector;
other models' int8 and OpenAI's response shape unchanged. Floats within 1e-5 (max abs) of the reference."""

import base64

import numpy as np
import pytest

from api.quantize import int8
from compat_tests.pplx_checkpoints import (
    assert_same_bits,
    assert_same_int8,
    reference_int8,
    reference_vector,
)
from tests.api.conftest import PPLX_CONTEXT, PPLX_EMBED

TOLERANCE = 1e-5  # max abs difference of the float vectors, fp32
TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "x",
    "Someone plays an old guitar by the river at night.",
]
FREE = {"input_cost": 0.0, "total_cost": 0.0, "currency": "USD"}


def embedded(pplx, **body):
    response = pplx.client.post("/v1/embeddings", json={"model": PPLX_EMBED, "input": TEXTS, **body})
    assert response.status_code == 200, response.text
    payload = response.json()
    assert [item["index"] for item in payload["data"]] == list(range(len(payload["data"])))
    return payload


def decoded(payload, dtype) -> np.ndarray:
    return np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype) for item in payload["data"]])


def floats(payload) -> np.ndarray:
    return np.array([item["embedding"] for item in payload["data"]], np.float32)


@pytest.fixture(scope="module")
def expected(pplx):
    return np.stack([reference_vector(pplx.references[PPLX_EMBED], ids) for ids in pplx.ids(TEXTS)])


def test_the_default_is_perplexitys_int8_of_the_raw_vector(pplx, expected):
    payload = embedded(pplx)  # Perplexity's SDK sends no encoding_format
    codes = decoded(payload, np.int8)
    assert codes.shape == (len(TEXTS), 64)
    assert_same_int8(codes, expected, TOLERANCE)
    num_tokens = sum(map(len, pplx.ids(TEXTS)))  # the tokenizer adds no special tokens
    assert payload["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens, "cost": FREE}
    assert payload["model"] == PPLX_EMBED and payload["object"] == "list"
    # the same request's codes are exactly the quantizer's of the same request's floats
    assert np.array_equal(decoded(embedded(pplx, encoding_format="base64_int8"), np.int8), codes)
    assert np.array_equal(codes, reference_int8(floats(embedded(pplx, encoding_format="float"))))


def test_float_and_base64_give_the_raw_unnormalized_vector(pplx, expected):
    vectors = floats(embedded(pplx, encoding_format="float"))
    np.testing.assert_allclose(vectors, expected, atol=TOLERANCE, rtol=0)
    assert np.abs(np.linalg.norm(vectors, axis=1) - 1).min() > 0.1  # not normalized
    assert np.array_equal(decoded(embedded(pplx, encoding_format="base64"), "<f4"), vectors)


def test_binary_is_the_sign_bits_least_significant_first(pplx, expected):
    vectors = floats(embedded(pplx, encoding_format="float"))
    packed = decoded(embedded(pplx, encoding_format="base64_binary"), np.uint8)
    assert packed.shape == (len(TEXTS), 8)
    bits = np.unpackbits(packed, axis=1, bitorder="little")  # as Perplexity's docs decode them
    assert np.array_equal(bits, (vectors >= 0).astype(np.uint8))
    assert_same_bits(bits, expected, TOLERANCE)
    # 12 dimensions: two bytes, the last four bits zero
    short = decoded(embedded(pplx, encoding_format="base64_binary", dimensions=12), np.uint8)
    assert short.shape == (len(TEXTS), 2) and not (short[:, 1] & 0xF0).any()
    assert np.array_equal(np.unpackbits(short, axis=1, bitorder="little")[:, :12], bits[:, :12])


def test_dimensions_keep_the_first_values_without_renormalizing(pplx):
    full = floats(embedded(pplx, encoding_format="float"))
    assert np.array_equal(floats(embedded(pplx, encoding_format="float", dimensions=16)), full[:, :16])
    codes = decoded(embedded(pplx, dimensions=16), np.int8)
    assert np.array_equal(codes, reference_int8(full)[:, :16])
    refused = pplx.client.post("/v1/embeddings", json={"model": PPLX_EMBED, "input": "x", "dimensions": 65})
    assert refused.status_code == 400 and "dimensions" in refused.json()["error"]["message"]


def test_a_contextual_models_text_is_its_mean(pplx):
    payload = pplx.client.post(
        "/v1/embeddings", json={"model": PPLX_CONTEXT, "input": TEXTS, "encoding_format": "float"}
    ).json()
    expected = np.stack([reference_vector(pplx.references[PPLX_CONTEXT], ids) for ids in pplx.ids(TEXTS)])
    np.testing.assert_allclose(floats(payload), expected, atol=TOLERANCE, rtol=0)


def test_other_models_int8_is_per_vector_and_openais_shape_stays(pplx):
    def embed(**body):
        response = pplx.client.post("/v1/embeddings", json={"model": "minilm", "input": TEXTS, **body})
        assert response.status_code == 200, response.text
        return response.json()

    plain = embed()
    vectors = floats(plain)
    assert set(plain["usage"]) == {"prompt_tokens", "total_tokens"}  # OpenAI's, no cost
    assert set(embed(encoding_format="base64")["usage"]) == {"prompt_tokens", "total_tokens"}
    int8_payload = embed(encoding_format="base64_int8")
    assert np.array_equal(decoded(int8_payload, np.int8), int8(vectors))  # round(127 x / max|x|)
    assert int8_payload["usage"]["cost"] == FREE
    bits = np.unpackbits(decoded(embed(encoding_format="base64_binary"), np.uint8), axis=1, bitorder="little")
    assert np.array_equal(bits, (vectors >= 0).astype(np.uint8))


@pytest.mark.parametrize("encoding_format", ["int8", "binary", "base64_uint8", 3])
def test_other_encodings_are_a_400(pplx, encoding_format):
    body = {"model": PPLX_EMBED, "input": "x", "encoding_format": encoding_format}
    response = pplx.client.post("/v1/embeddings", json=body)
    assert response.status_code == 400 and "encoding_format" in response.json()["error"]["message"]
