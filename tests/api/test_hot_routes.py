"""The routes that run a model are answered before Litestar's router (api/hot_routes.py): every answer,
success or error, is the one Litestar's own dispatch of the same handler gives, headers included."""

import json

import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig

HOT = {
    "/v1/embeddings",
    "/embeddings",
    "/v2/embed",
    "/v1/rerank",
    "/v2/rerank",
    "/rerank",
    "/embed",
    "/score",
    "/v1/score",
    "/pooling",
    "/v1/pooling",
    "/classify",
    "/v1/classify",
    "/embed_sparse",
    "/v1/contextualizedembeddings",
}
RERANK = {"query": "what is a cat?", "documents": ["a cat is an animal", "stocks fell"]}
REQUESTS = [
    ("/v1/embeddings", {"input": ["a cat", "a dog"]}),
    ("/v1/embeddings", {"input": "a cat", "encoding_format": "base64", "dimensions": 32}),
    ("/v1/embeddings", {"input": ["a cat"], "model": "not-served"}),
    ("/v1/embeddings", {"input": []}),
    ("/v1/embeddings", {"input": "x", "dimensions": "64"}),
    ("/embeddings", {"input": [1, 2]}),  # token ids: refused without --accept-token-ids
    ("/v2/embed", {"texts": ["a cat"], "input_type": "search_query", "embedding_types": ["float", "base64"]}),
    ("/v2/embed", {"texts": ["a cat"], "embedding_types": ["complex"]}),
    ("/embed", {"inputs": ["a cat", "a dog"]}),
    ("/embed", {"inputs": ""}),
    ("/v1/rerank", RERANK),
    ("/v2/rerank", {**RERANK, "top_n": 0}),
    ("/rerank", {"query": "q", "texts": ["d", "e"], "return_text": True}),
    ("/rerank", {"query": "q"}),
    ("/score", {"text_1": "q", "text_2": ["d", "e"]}),
    ("/pooling", {"input": ["a cat", "a dog"]}),
    ("/pooling", {"input": "a cat", "task": "token_embed"}),  # the bundled model has no token vectors
    ("/classify", {"input": "a cat"}),  # nor labels
    ("/embed_sparse", {"inputs": "a cat"}),  # nor sparse weights
    ("/v1/contextualizedembeddings", {"input": [["a cat", "sat"], ["a dog"]]}),
    ("/v1/contextualizedembeddings", {"inputs": [["a cat"]], "output_dtype": "ubinary"}),
    ("/v1/contextualizedembeddings", {"input": [["a cat", 3]]}),  # FastAPI's 422
]
# headers whose values differ between two answers to the same request
VOLATILE_HEADERS = {
    "x-request-id",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
    "server-timing",
}


@pytest.fixture(scope="module")
def app():
    # a model that embeds and reranks: the bundled one serves embeddings, its pairs score as a cross-encoder
    return create_app(ServerConfig(max_body_bytes=4096))


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as test_client:
        yield test_client


def answers(client, app, path, content, headers=None):
    """The (hot, Litestar) answers to one request."""
    hot = client.post(path, content=content, headers=headers)
    handlers, app.hot_routes.handlers = app.hot_routes.handlers, {}
    try:
        routed = client.post(path, content=content, headers=headers)
    finally:
        app.hot_routes.handlers = handlers
    return hot, routed


def assert_same(hot, routed):
    assert hot.status_code == routed.status_code
    assert {name: value for name, value in hot.headers.items() if name not in VOLATILE_HEADERS} == {
        name: value for name, value in routed.headers.items() if name not in VOLATILE_HEADERS
    }
    assert VOLATILE_HEADERS <= set(hot.headers) or hot.status_code != 200
    assert "x-request-id" in hot.headers
    body, expected = hot.json(), routed.json()
    if isinstance(body, dict) and "id" in body:  # Cohere's and vLLM's response ids are new each time
        body.pop("id"), expected.pop("id")
    if isinstance(body, dict) and "created" in body:  # vLLM's, in whole seconds: the two may straddle one
        assert 0 <= expected.pop("created") - body.pop("created") <= 1
    assert body == expected


def test_the_routes_that_run_a_model_are_hot(app):
    assert set(app.hot_routes.handlers) == HOT


@pytest.mark.parametrize(("path", "payload"), REQUESTS, ids=lambda value: json.dumps(value)[:40])
def test_answers_match_litestars(client, app, path, payload):
    hot, routed = answers(client, app, path, json.dumps(payload).encode())
    assert_same(hot, routed)


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"input": "\xff"}', json.dumps({"input": ["x" * 100] * 60}).encode()],
    ids=["invalid JSON", "invalid UTF-8", "over the body limit"],
)
@pytest.mark.parametrize("path", ["/v1/embeddings", "/v2/rerank", "/embed"])
def test_bad_bodies_match_litestars(client, app, path, content):
    hot, routed = answers(client, app, path, content)
    assert hot.status_code in (400, 413, 422)
    assert_same(hot, routed)


def test_errors_and_successes_are_counted_by_route(client):
    client.post("/v1/embeddings", json={"input": "counted"})
    client.post("/v1/embeddings", json={"input": []})
    text = client.get("/metrics").text
    assert 'posy_requests_total{route="/v1/embeddings",status="200"}' in text
    assert 'posy_requests_total{route="/v1/embeddings",status="400"}' in text
    assert 'posy_request_stage_seconds_count{route="/v1/embeddings",stage="inference"}' in text


def test_an_api_key_guards_the_hot_routes_as_the_others():
    app = create_app(ServerConfig(api_key="k3y"))
    with TestClient(app) as client:
        for headers in ({}, {"authorization": "Bearer nope"}, {"x-api-key": "k3y"}):
            hot, routed = answers(client, app, "/v1/embeddings", b'{"input": "a"}', headers)
            assert_same(hot, routed)
        assert hot.status_code == 200
        assert client.post("/v1/embeddings", json={"input": "a"}).headers["www-authenticate"] == "Bearer"
