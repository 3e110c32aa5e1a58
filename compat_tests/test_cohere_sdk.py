"""The official cohere SDK (Client for v1, ClientV2 for v2) against a live server's rerank routes and
/v2/embed."""

from __future__ import annotations

import base64

import cohere
import numpy as np
import pytest
from cohere.core.api_error import ApiError

from .contract import MODEL, assert_cohere_error, cohere_client, cosine

QUERY = "What is the capital of France?"
DOCS = [
    "Paris is the capital and largest city of France.",
    "Bananas are a yellow fruit rich in potassium.",
    "The Eiffel Tower was finished in 1889.",
    "Python is a popular programming language.",
]

FILLER = (
    "The quarterly budget review covered office supplies, printer maintenance and travel reimbursements. "
    "Invoices must be filed in the shared folder before the end of each month. "
    "The committee approved a new schedule for the parking garage repairs. "
    "Spreadsheet templates were updated to include the revised tax codes. "
    "Several employees asked about the holiday calendar and the vacation carry-over policy. "
).split()
PENGUIN_QUERY = "Where do emperor penguins raise their chicks?"
PENGUIN_DOCS = [
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Stock prices rose sharply after the earnings report.",
    # about 600 words of filler (~790 tokens, several windows), then the only relevant sentence
    " ".join((FILLER * 20)[:600])
    + " Emperor penguins raise their chicks on the Antarctic sea ice, where each father keeps the egg warm"
    " on his feet through the long dark winter.",
    "The train to Berlin leaves from platform nine.",
]
LONG_INDEX = 2


@pytest.fixture(scope="module")
def co_v1(base_url):
    with cohere_client(cohere.Client, base_url, timeout=120.0) as client:
        yield client


@pytest.fixture(scope="module")
def co_v2(base_url):
    with cohere_client(cohere.ClientV2, base_url, timeout=120.0) as client:
        yield client


@pytest.fixture(params=["v1", "v2"])
def rerank(request, co_v1, co_v2):
    """The SDK's rerank for one API version; v2 gets return_documents as an extra body field."""
    version = request.param

    def rerank(**kwargs):
        if version == "v1":
            return co_v1.rerank(**kwargs)
        options = {}
        if "return_documents" in kwargs:
            options["additional_body_parameters"] = {"return_documents": kwargs.pop("return_documents")}
        return co_v2.rerank(**kwargs, request_options=options or None)

    rerank.version = version
    return rerank


def document_text(result) -> str:
    document = result.document
    return document["text"] if isinstance(document, dict) else document.text


def assert_ranked(response, num_documents: int) -> list[float]:
    scores = [result.relevance_score for result in response.results]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= score <= 1.0 for score in scores), scores
    indexes = [result.index for result in response.results]
    assert len(set(indexes)) == len(indexes) and set(indexes) <= set(range(num_documents))
    return scores


def test_rerank_sorted_with_scores_in_unit_range(rerank):
    response = rerank(model=MODEL, query=QUERY, documents=DOCS)
    assert len(assert_ranked(response, len(DOCS))) == len(DOCS)
    assert response.results[0].index == 0
    assert isinstance(response.id, str) and response.id
    assert response.meta.api_version.version == rerank.version[1:]


def test_scores_are_one_plus_cosine_over_two(rerank, embed):
    response = rerank(model=MODEL, query=QUERY, documents=DOCS)
    query_vector, *doc_vectors = embed([QUERY, *DOCS])
    for result in response.results:
        expected = (1.0 + cosine(query_vector, doc_vectors[result.index])) / 2.0
        assert result.relevance_score == pytest.approx(expected, abs=1e-3)


def test_top_n_keeps_the_best(rerank):
    full = rerank(model=MODEL, query=QUERY, documents=DOCS)
    top = rerank(model=MODEL, query=QUERY, documents=DOCS, top_n=2)
    assert [result.index for result in top.results] == [result.index for result in full.results[:2]]


def test_return_documents_true_gives_text(rerank):
    response = rerank(model=MODEL, query=QUERY, documents=DOCS, return_documents=True)
    assert len(response.results) == len(DOCS)
    for result in response.results:
        assert document_text(result) == DOCS[result.index]


def test_return_documents_false_leaves_document_out(rerank, http):
    response = rerank(model=MODEL, query=QUERY, documents=DOCS, return_documents=False)
    assert all(getattr(result, "document", None) is None for result in response.results)
    route = f"/{rerank.version}/rerank"
    bodies = [{"model": MODEL, "query": QUERY, "documents": DOCS, "return_documents": False}]
    if rerank.version == "v1":
        bodies.append({"model": MODEL, "query": QUERY, "documents": DOCS})  # v1 default is false
    for body in bodies:
        raw = http.post(route, json=body)
        assert raw.status_code == 200, raw.text
        for result in raw.json()["results"]:
            assert "document" not in result, result


def test_raw_response_shape(rerank, http):
    raw = http.post(f"/{rerank.version}/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS})
    assert raw.status_code == 200, raw.text
    body = raw.json()
    assert isinstance(body["id"], str) and body["id"]
    assert body["meta"]["api_version"]["version"] == rerank.version[1:]
    assert body["meta"]["billed_units"]["search_units"] == 1
    assert {"index", "relevance_score"} <= body["results"][0].keys()


def test_v1_documents_as_objects(co_v1):
    as_strings = co_v1.rerank(model=MODEL, query=QUERY, documents=DOCS)
    as_objects = co_v1.rerank(
        model=MODEL, query=QUERY, documents=[{"text": doc} for doc in DOCS], return_documents=True
    )
    assert [r.index for r in as_objects.results] == [r.index for r in as_strings.results]
    for with_object, with_string in zip(as_objects.results, as_strings.results):
        assert with_object.relevance_score == pytest.approx(with_string.relevance_score, abs=1e-5)
        assert with_object.document.text == DOCS[with_object.index]


def test_v1_rank_fields_selects_the_field(co_v1):
    documents = [
        {"title": "The capital city of France", "text": "Bananas are a yellow fruit rich in potassium."},
        {"title": "Tropical fruit", "text": "Paris is the capital and largest city of France."},
    ]
    by_text = co_v1.rerank(model=MODEL, query=QUERY, documents=documents)
    by_title = co_v1.rerank(model=MODEL, query=QUERY, documents=documents, rank_fields=["title"])
    assert [r.index for r in by_text.results] == [1, 0]
    assert [r.index for r in by_title.results] == [0, 1]


def test_relevant_end_of_long_document_ranks_first(rerank):
    response = rerank(model=MODEL, query=PENGUIN_QUERY, documents=PENGUIN_DOCS)
    assert_ranked(response, len(PENGUIN_DOCS))
    assert response.results[0].index == LONG_INDEX


def test_v1_max_chunks_per_doc_limits_chunks(co_v1):
    arguments = {"model": MODEL, "query": PENGUIN_QUERY, "documents": PENGUIN_DOCS}
    every_chunk = co_v1.rerank(**arguments, max_chunks_per_doc=10)
    first_chunk = co_v1.rerank(**arguments, max_chunks_per_doc=1)
    assert every_chunk.results[0].index == LONG_INDEX
    assert first_chunk.results[-1].index == LONG_INDEX  # only filler was scored


def test_v2_max_tokens_per_doc_cuts_documents(co_v2):
    arguments = {"model": MODEL, "query": PENGUIN_QUERY, "documents": PENGUIN_DOCS}
    uncut = co_v2.rerank(**arguments, max_tokens_per_doc=4096)
    cut = co_v2.rerank(**arguments, max_tokens_per_doc=64)
    assert uncut.results[0].index == LONG_INDEX
    assert cut.results[-1].index == LONG_INDEX  # the relevant end was cut away


@pytest.mark.parametrize(
    ("kwargs", "status_code", "error_class"),
    [
        pytest.param({"documents": []}, 400, cohere.BadRequestError, id="empty-documents"),
        pytest.param({"query": ""}, 400, cohere.BadRequestError, id="empty-query"),
        pytest.param({"top_n": 0}, 400, cohere.BadRequestError, id="top-n-zero"),
        pytest.param({"model": "no-such-model"}, 404, cohere.NotFoundError, id="unknown-model"),
    ],
)
def test_errors(rerank, kwargs, status_code, error_class):
    arguments = {"model": MODEL, "query": QUERY, "documents": DOCS, **kwargs}
    with pytest.raises(ApiError) as raised:
        rerank(**arguments)
    assert raised.value.status_code == status_code
    assert isinstance(raised.value, error_class)
    assert isinstance(raised.value.body, dict) and raised.value.body.get("message"), raised.value.body


def test_error_body_is_cohere_shape(http):
    for route in ("/v1/rerank", "/v2/rerank"):
        assert_cohere_error(http.post(route, json={"model": MODEL, "query": QUERY, "documents": []}), 400)
        unknown_model = {"model": "no-such-model", "query": QUERY, "documents": DOCS}
        assert_cohere_error(http.post(route, json=unknown_model), 404)


def test_legacy_and_unknown_fields_are_accepted(http):
    v2_with_v1_fields = {
        "model": MODEL,
        "query": QUERY,
        "documents": DOCS,
        "return_documents": True,
        "rank_fields": ["text"],
        "max_chunks_per_doc": 10,
        "some_future_field": 1,
    }
    response = http.post("/v2/rerank", json=v2_with_v1_fields)
    assert response.status_code == 200, response.text
    top = response.json()["results"][0]
    assert top["index"] == 0 and top["document"]["text"] == DOCS[0]

    v1_without_model = {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 4096, "some_future_field": 1}
    response = http.post("/v1/rerank", json=v1_without_model)
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["index"] == 0


def test_v2_embed_by_type_gives_the_openai_routes_vectors(co_v2, embed):
    response = co_v2.embed(
        model=MODEL, input_type="search_document", texts=DOCS,
        embedding_types=["float", "int8", "ubinary", "base64"],
    )  # fmt: skip
    floats = np.array(response.embeddings.float_, dtype=np.float32)
    np.testing.assert_allclose(floats, embed(DOCS), rtol=0, atol=1e-6)
    int8 = np.array(response.embeddings.int8)
    assert int8.shape == floats.shape and (np.abs(int8).max(axis=1) == 127).all()
    ubinary = np.array(response.embeddings.ubinary, dtype=np.uint8)
    assert (np.unpackbits(ubinary, axis=1) == (floats > 0)).all()
    decoded = [np.frombuffer(base64.b64decode(row), dtype="<f4") for row in response.embeddings.base64]
    assert np.array_equal(np.stack(decoded), floats)
    assert response.meta.billed_units.input_tokens > len(DOCS)
    query = co_v2.embed(model=MODEL, input_type="search_query", texts=[QUERY], embedding_types=["float"])
    scores = floats @ np.array(query.embeddings.float_[0], dtype=np.float32)
    assert int(np.argmax(scores)) == 0  # Paris
    # the same texts as v2's `inputs`, the SDK's multimodal form, of text content
    inputs = [{"content": [{"type": "text", "text": text}]} for text in DOCS]
    as_inputs = co_v2.embed(
        model=MODEL, input_type="search_document", inputs=inputs, embedding_types=["float"]
    )
    np.testing.assert_array_equal(np.array(as_inputs.embeddings.float_, dtype=np.float32), floats)
