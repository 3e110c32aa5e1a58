"""/v1/contextualizedembeddings: Perplexity's request (`input`) and Voyage's (`inputs`) on tiny pplx-embed
checkpoints and the bundled model. A contextual model's chunks within 1e-5 (max abs, fp32) of the reference
(the document read whole, chunks joined by <|endoftext|>, each the mean of its own tokens) and its int8 the
reference quantizer's; every limit a 400 that names it; errors in Perplexity's (FastAPI's) shape; bad input
never a 5xx, and the server keeps serving."""

import base64

import numpy as np
import pytest

from api.errors import NotReady, error_parts
from api.quantize import QUANTIZERS, int8
from compat_tests.pplx_checkpoints import (
    assert_same_int8,
    reference_chunks,
    reference_int8,
    reference_vector,
)
from engine.errors import EngineStopped, Overloaded
from tests.api.conftest import PPLX_CONTEXT, PPLX_EMBED

TOLERANCE = 1e-5
PATH = "/v1/contextualizedembeddings"
DOCUMENTS = [
    ["Berlin is the capital of Germany.", "The city has 3.8 million inhabitants.", "It is also a state."],
    ["The Eiffel Tower was finished in 1889."],
    ["Bananas are a yellow fruit rich in potassium.", "They grow in the tropics."],
]
FREE = {"input_cost": 0.0, "total_cost": 0.0, "currency": "USD"}
VOYAGE_QUERY = "Represent the query for retrieving supporting documents: "
# output_dtype -> (the dtype of its base64 bytes, its codes from the float vectors): the model's own int8
# (pplx-embed's tanh), int8 + 128, and Cohere's packed bits
VOYAGE_TYPES = {
    "int8": (np.int8, reference_int8),
    "uint8": (np.uint8, lambda vectors: reference_int8(vectors).astype(np.int16) + 128),
    "binary": (np.int8, QUANTIZERS["binary"]),
    "ubinary": (np.uint8, QUANTIZERS["ubinary"]),
}


def post(pplx, **body):
    return pplx.client.post(PATH, json={"model": PPLX_CONTEXT, **body})


def answered(pplx, **body) -> dict:
    response = post(pplx, **body)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["object"] == "list" and [doc["index"] for doc in payload["data"]] == list(
        range(len(payload["data"]))
    )
    for document in payload["data"]:
        assert document["object"] == "list"
        assert [item["index"] for item in document["data"]] == list(range(len(document["data"])))
        assert {item["object"] for item in document["data"]} == {"embedding"}
    return payload


def decoded(payload, dtype) -> list[np.ndarray]:
    return [
        np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype) for item in document["data"]])
        for document in payload["data"]
    ]


def listed(payload) -> list[np.ndarray]:
    return [np.array([item["embedding"] for item in document["data"]]) for document in payload["data"]]


def expected_chunks(pplx, documents, head=()):
    reference = pplx.references[PPLX_CONTEXT]
    return [reference_chunks(reference, pplx.ids(chunks), pplx.separator, head) for chunks in documents]


def test_each_chunk_is_its_mean_in_the_whole_document(pplx):
    payload = answered(pplx, inputs=DOCUMENTS, encoding_format="base64")  # Voyage's float32 bytes
    expected = expected_chunks(pplx, DOCUMENTS)
    for vectors, want in zip(decoded(payload, "<f4"), expected):
        np.testing.assert_allclose(vectors, want, atol=TOLERANCE, rtol=0)
    alone = np.stack([reference_vector(pplx.references[PPLX_CONTEXT], ids) for ids in pplx.ids(DOCUMENTS[0])])
    assert np.abs(expected[0] - alone).max() > 100 * TOLERANCE  # a chunk reads its neighbours
    # the separators between chunks are run and counted; Voyage's usage has total_tokens alone
    num_tokens = sum(len(ids) for chunks in DOCUMENTS for ids in pplx.ids(chunks)) + sum(
        len(chunks) - 1 for chunks in DOCUMENTS
    )
    assert payload["usage"] == {"total_tokens": num_tokens}


def test_perplexitys_default_is_the_int8_of_each_chunk(pplx):
    payload = answered(pplx, input=DOCUMENTS)
    floats = decoded(answered(pplx, inputs=DOCUMENTS, encoding_format="base64"), "<f4")
    for codes, vectors, want in zip(decoded(payload, np.int8), floats, expected_chunks(pplx, DOCUMENTS)):
        assert np.array_equal(codes, reference_int8(vectors))
        assert_same_int8(codes, want, TOLERANCE)
    usage = payload["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] and usage["cost"] == FREE
    assert payload["model"] == PPLX_CONTEXT
    bits = decoded(answered(pplx, input=DOCUMENTS, encoding_format="base64_binary", dimensions=16), np.uint8)
    for packed, vectors in zip(bits, floats):
        assert packed.shape == (len(vectors), 2)
        assert np.array_equal(np.unpackbits(packed, axis=1, bitorder="little"), vectors[:, :16] >= 0)


def test_a_literal_separator_in_a_chunk_splits_nothing(pplx):
    documents = [["Paris <|endoftext|> is the capital", "of France."]]
    assert pplx.separator in pplx.ids(documents[0])[0]  # the tokenizer reads the literal as the token
    payload = answered(pplx, inputs=documents, encoding_format="base64")
    [vectors] = decoded(payload, "<f4")
    assert vectors.shape == (2, 64)
    # its chunks tokenized apart, the literal token inside the first one's mean
    [want] = expected_chunks(pplx, documents)
    np.testing.assert_allclose(vectors, want, atol=TOLERANCE, rtol=0)


def test_a_one_chunk_document_is_the_texts_embedding(pplx):
    [[vector]] = listed(answered(pplx, inputs=[[DOCUMENTS[1][0]]]))
    single = pplx.client.post(
        "/v1/embeddings", json={"model": PPLX_CONTEXT, "input": DOCUMENTS[1][0], "encoding_format": "float"}
    ).json()
    np.testing.assert_allclose(vector, single["data"][0]["embedding"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("model", [PPLX_EMBED, "minilm"])
def test_a_mean_pooling_embedder_late_chunks_as_jina(pplx, model):
    """pplx-embed-v1 (no separator) and the bundled model: each document as /v1/embeddings' late_chunking
    reads it ([CLS] chunks [SEP] for the bundled model), normalized where the model is."""
    [vectors, one] = listed(answered(pplx, model=model, inputs=[DOCUMENTS[0], DOCUMENTS[1]]))
    late = pplx.client.post(
        "/v1/embeddings",
        json={"model": model, "input": DOCUMENTS[0], "late_chunking": True, "encoding_format": "float"},
    ).json()
    late_vectors = np.array([item["embedding"] for item in late["data"]])
    np.testing.assert_allclose(vectors, late_vectors, atol=TOLERANCE, rtol=0)
    assert one.shape == (1, vectors.shape[1])


def test_voyages_types_prompts_and_dimensions(pplx):
    floats = listed(answered(pplx, inputs=DOCUMENTS))  # JSON numbers without encoding_format
    for output_dtype, (dtype, quantized) in VOYAGE_TYPES.items():
        as_numbers = listed(answered(pplx, inputs=DOCUMENTS, output_dtype=output_dtype))
        body = {"inputs": DOCUMENTS, "output_dtype": output_dtype, "encoding_format": "base64"}
        as_bytes = decoded(answered(pplx, **body), dtype)  # each row's numpy bytes
        for numbers, raw, vectors in zip(as_numbers, as_bytes, floats):
            want = quantized(vectors.astype(np.float32))
            assert np.array_equal(numbers, want) and np.array_equal(raw, want), output_dtype
    short = listed(answered(pplx, inputs=DOCUMENTS, output_dimension=8))
    assert all(np.array_equal(cut, vectors[:, :8]) for cut, vectors in zip(short, floats))
    # input_type: each document read after Voyage's prompt, which belongs to no chunk
    query = answered(pplx, inputs=DOCUMENTS[:1], input_type="query")
    head = pplx.ids([VOYAGE_QUERY])[0]
    want = expected_chunks(pplx, DOCUMENTS[:1], head)[0]
    np.testing.assert_allclose(listed(query)[0], want, atol=TOLERANCE, rtol=0)
    num_chunk_tokens = sum(map(len, pplx.ids(DOCUMENTS[0])))
    assert query["usage"]["total_tokens"] == len(head) + num_chunk_tokens + len(DOCUMENTS[0]) - 1


def test_another_models_int8_is_per_vector(pplx):
    floats = listed(answered(pplx, model="minilm", inputs=DOCUMENTS))
    codes = decoded(answered(pplx, model="minilm", input=DOCUMENTS), np.int8)
    for vectors, ours in zip(floats, codes):
        assert np.array_equal(ours, int8(vectors.astype(np.float32)))


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": [["a"]] * 513}, "limit of 512 documents"),
        ({"inputs": [["a"]] * 1001}, "limit of 1000 documents"),
        ({"input": [["a"] * 8001, ["b"] * 8000]}, "limit of 16000 chunks"),
        ({"input": [["a", "1 " * 300]]}, "window of 512 tokens a document"),  # a token a digit, a space
        ({"input": [["a"], ["word " * 20_000]]}, "window of 512 tokens a document"),
        ({"input": [["a", ""]]}, "input[0][1] is an empty string"),
        ({"input": [["a"], []]}, "input[1] has no chunks"),
        ({"input": []}, "at least one document"),
        ({"input": [["a"]], "inputs": [["a"]]}, "not both"),
        ({"input": [["a"]], "encoding_format": "base64"}, "base64_int8 or base64_binary"),
        ({"inputs": [["a"]], "encoding_format": "base64_int8"}, "none or base64"),
        ({"input": [["a"]], "output_dtype": "int8"}, "output_dtype is not a field of Perplexity's"),
        ({"inputs": [["a"]], "dimensions": 8}, "dimensions is not a field of Voyage's"),
        ({"input": [["a"]], "dimensions": 65}, "dimensions must be between 1 and the model's 64"),
    ],
)
def test_each_limit_is_a_400_that_names_it(pplx, body, named):
    response = post(pplx, **body)
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["detail"] and named in response.json()["detail"]


def test_a_request_past_120000_tokens_is_a_400(pplx):
    document = "1 " * 240  # 480 tokens: a digit and a space each
    assert len(pplx.ids([document])[0]) == 480
    response = post(pplx, input=[[document]] * 300)
    assert response.status_code == 400, response.text
    assert "limit of 120000 tokens a request" in response.json()["detail"]


def test_schema_faults_are_fastapis_422(pplx):
    response = post(pplx, input=[["a", 3]])
    assert response.status_code == 422
    [fault] = response.json()["detail"]
    assert fault["loc"] == ["body", "input", 0, 1] and fault["type"] == "string_type" and fault["msg"]
    missing = pplx.client.post(PATH, json={"model": PPLX_CONTEXT})
    assert missing.status_code == 422 and missing.json()["detail"][0]["type"] == "missing"
    broken = pplx.client.post(PATH, content=b'{"input": [[', headers={"content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["detail"][0]["type"] == "json_invalid"
    wrong_type = post(pplx, input=[["a"]], input_type="passage")
    assert wrong_type.status_code == 422 and wrong_type.json()["detail"][0]["loc"] == ["body", "input_type"]


def test_unknown_model_and_large_body_in_perplexitys_shape(pplx):
    unknown = pplx.client.post(PATH, json={"model": "nope", "input": [["a"]]})
    assert unknown.status_code == 404 and "nope" in unknown.json()["detail"]
    large = pplx.client.post(PATH, content=b" " * (9 << 20), headers={"content-type": "application/json"})
    assert large.status_code == 413 and list(large.json()) == ["detail"]
    # /v1/embeddings keeps OpenAI's shape
    assert "error" in pplx.client.post("/v1/embeddings", json={"model": "nope", "input": "a"}).json()


@pytest.mark.parametrize(
    ("error", "status", "retry_after"),
    [
        (Overloaded(10, 5, retry_after_s=3), 429, "3"),
        (NotReady("loading"), 503, "1"),
        (EngineStopped("a replica restarted"), 503, "5"),
    ],
)
def test_refusals_are_perplexitys_shape_with_retry_after(error, status, retry_after):
    scope = {"type": "http", "path": PATH, "headers": []}
    answered_status, body, headers = error_parts(scope, error)
    assert (answered_status, list(body), headers["Retry-After"]) == (status, ["detail"], retry_after)
    assert isinstance(body["detail"], str)


@pytest.mark.parametrize(
    "content",
    [
        b"[" * 100_000,
        b'{"input": [["\\ud800"]]}',
        b'{"input": [["a"]], "dimensions": 1e400}',
        b'{"input": [["a"]], "model": null, "dimensions": -1}',
        b'{"input": [[null]]}',
        b'{"inputs": "abc"}',
        b"\xff\xfe",
        b'{"input": [["' + "\u00e9".encode() * 200_000 + b'"]]}',
    ],
)
def test_bad_input_is_a_4xx_and_the_server_keeps_serving(pplx, content):
    response = pplx.client.post(PATH, content=content, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert "detail" in response.json()
    assert post(pplx, input=[["still serving"]]).status_code == 200
