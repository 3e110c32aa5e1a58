"""Plain HTTP (what curl sends) against a live server: TEI /rerank, health, metrics, errors, load, flags."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .contract import (
    DIM,
    MAX_BODY_BYTES,
    MODEL,
    SAME_VECTOR,
    WINDOW,
    assert_cohere_error,
    assert_openai_error,
    assert_tei_error,
    cosine,
    words,
)

QUERY = "What is the capital of France?"
TEXTS = [
    "Paris is the capital and largest city of France.",
    "Bananas are a yellow fruit rich in potassium.",
    "Python is a popular programming language.",
]
EMBED_ROUTE = "/v1/embeddings"


def good_embedding_request(http: httpx.Client) -> None:
    response = http.post(EMBED_ROUTE, json={"model": MODEL, "input": TEXTS[0], "encoding_format": "float"})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == DIM


# TEI /rerank


def test_tei_rerank_sorted_without_text(http, embed):
    response = http.post("/rerank", json={"query": QUERY, "texts": TEXTS})
    assert response.status_code == 200, response.text
    results = response.json()
    assert isinstance(results, list) and len(results) == len(TEXTS)
    assert sorted(result["index"] for result in results) == list(range(len(TEXTS)))
    scores = [result["score"] for result in results]
    assert scores == sorted(scores, reverse=True)
    assert results[0]["index"] == 0
    assert all("text" not in result for result in results)
    query_vector, *text_vectors = embed([QUERY, *TEXTS])
    for result in results:
        expected = (1.0 + cosine(query_vector, text_vectors[result["index"]])) / 2.0
        assert result["score"] == pytest.approx(expected, abs=1e-3)


def test_tei_rerank_return_text_and_raw_scores(http):
    plain = http.post("/rerank", json={"query": QUERY, "texts": TEXTS}).json()
    body = {"query": QUERY, "texts": TEXTS, "return_text": True, "raw_scores": True}
    response = http.post("/rerank", json=body)
    assert response.status_code == 200, response.text
    results = response.json()
    assert [result["index"] for result in results] == [result["index"] for result in plain]
    for result in results:
        assert result["text"] == TEXTS[result["index"]]
        assert isinstance(result["score"], float)


def test_tei_rerank_errors(http):
    assert_tei_error(http.post("/rerank", json={"query": QUERY, "texts": []}), 422)
    assert_tei_error(http.post("/rerank", json={"query": QUERY, "texts": "not a list"}), 422)
    response = http.post("/rerank", json={"query": QUERY, "texts": TEXTS, "some_future_field": 1})
    assert response.status_code == 200, response.text


# health, readiness, request ids, metrics


def test_health_and_ready(http):
    assert http.get("/health").status_code == 200
    assert http.get("/ready").status_code == 200


def test_every_response_has_a_request_id(http):
    responses = [
        http.get("/health"),
        http.get("/v1/models"),
        http.get("/metrics"),
        http.post(EMBED_ROUTE, json={"model": MODEL, "input": "hello"}),
        http.post(EMBED_ROUTE, json={"model": "no-such-model", "input": "hello"}),
        http.post("/v1/rerank", json={"query": QUERY, "documents": []}),
        http.post("/rerank", json={"query": QUERY, "texts": TEXTS}),
        http.post(EMBED_ROUTE, content=b"{not json", headers={"content-type": "application/json"}),
    ]
    request_ids = [response.headers.get("x-request-id") for response in responses]
    assert all(request_ids), list(zip([str(r.url) for r in responses], request_ids))
    assert len(set(request_ids)) == len(request_ids), request_ids


def metric_families(http: httpx.Client) -> dict:
    response = http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def embedding_200_count(families: dict) -> float:
    return sum(
        sample.value
        for family in families.values()
        if family.type == "counter" and family.name.startswith("posy_")
        for sample in family.samples
        if sample.name.endswith("_total")
        and EMBED_ROUTE in sample.labels.values()
        and "200" in sample.labels.values()
    )


def observations(family, route: str | None = None) -> float:
    return sum(
        sample.value
        for sample in family.samples
        if sample.name.endswith("_count") and (route is None or route in sample.labels.values())
    )


def test_metrics(http):
    before = embedding_200_count(metric_families(http))
    good_embedding_request(http)
    good_embedding_request(http)
    families = metric_families(http)
    assert embedding_200_count(families) >= before + 2, "no posy_ counter by route and status for 200s"
    posy = {name: family for name, family in families.items() if name.startswith("posy_")}
    histograms = {name: family for name, family in posy.items() if family.type == "histogram"}
    latency_words = ("latency", "duration", "seconds")
    latency = [f for name, f in histograms.items() if any(word in name for word in latency_words)]
    assert any(observations(family, EMBED_ROUTE) >= 2 for family in latency), sorted(histograms)
    gauges = [name for name, family in posy.items() if family.type == "gauge"]
    assert any("queue" in name and "token" in name for name in gauges), sorted(posy)
    batch_tokens = [f for name, f in histograms.items() if "batch" in name and "token" in name]
    batch_sequences = [f for name, f in histograms.items() if "batch" in name and "seq" in name]
    assert any(observations(family) >= 1 for family in batch_tokens), sorted(histograms)
    assert any(observations(family) >= 1 for family in batch_sequences), sorted(histograms)


def test_metrics_say_how_each_model_runs(http):
    info = metric_families(http)["posy_model_info"]
    labels = [sample.labels for sample in info.samples if sample.name == "posy_model_info"]
    assert len(labels) == 1
    assert labels[0]["architecture"] == "BertModel" and labels[0]["task"] == "embed"
    assert labels[0]["implementation"] == "posy"
    runs_on = tuple(labels[0][key] for key in ("device", "dtype", "attention_backend", "cuda_graphs"))
    assert runs_on == ("cpu", "float32", "torch", "off")


# malformed and wrong-typed input


def post_raw(http: httpx.Client, route: str, content: bytes) -> httpx.Response:
    return http.post(route, content=content, headers={"content-type": "application/json"})


@pytest.mark.parametrize("content", [b'{"model": "x", "input": ', b"not json at all", b""])
def test_malformed_json_in_each_route_shape(http, content):
    assert_openai_error(post_raw(http, EMBED_ROUTE, content), 400)
    assert_cohere_error(post_raw(http, "/v1/rerank", content), 400)
    assert_cohere_error(post_raw(http, "/v2/rerank", content), 400)
    assert_tei_error(post_raw(http, "/rerank", content), 422)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"model": MODEL, "input": 5}, id="input-number"),
        pytest.param({"model": MODEL, "input": ["text", 7]}, id="input-strings-and-ids"),
        pytest.param({"model": MODEL, "input": [[101, 102], "text"]}, id="input-id-lists-and-strings"),
        pytest.param({"model": MODEL, "input": [1.5, 2.5]}, id="input-fractional-ids"),
        pytest.param({"model": MODEL, "input": {"text": "hello"}}, id="input-object"),
        pytest.param({"model": MODEL, "input": "hello", "dimensions": "64"}, id="dimensions-as-string"),
        pytest.param({"model": MODEL, "input": "hello", "encoding_format": "int8"}, id="unknown-encoding"),
        pytest.param({"model": 7, "input": "hello"}, id="model-number"),
    ],
)
def test_wrong_types_are_openai_400(http, body):
    assert_openai_error(http.post(EMBED_ROUTE, json=body), 400)


def test_nan_is_a_clear_400(http):
    assert_openai_error(post_raw(http, EMBED_ROUTE, b'{"model": "%s", "input": [NaN]}' % MODEL.encode()), 400)


@pytest.mark.parametrize("route", ["/v1/rerank", "/v2/rerank"])
@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"query": 5, "documents": TEXTS}, id="query-number"),
        pytest.param({"query": QUERY, "documents": "not a list"}, id="documents-string"),
        pytest.param({"query": QUERY, "documents": [1, 2]}, id="documents-numbers"),
        pytest.param({"query": QUERY, "documents": TEXTS, "top_n": "two"}, id="top-n-word"),
        pytest.param({"query": QUERY, "documents": TEXTS, "top_n": "2"}, id="top-n-as-string"),
    ],
)
def test_wrong_types_are_cohere_400(http, route, body):
    assert_cohere_error(http.post(route, json={"model": MODEL, **body}), 400)


def test_too_many_inputs_is_400(http):
    assert_openai_error(http.post(EMBED_ROUTE, json={"model": MODEL, "input": ["x"] * 2049}), 400)


@pytest.mark.parametrize(
    ("route", "field", "assert_error"),
    [
        (EMBED_ROUTE, "input", assert_openai_error),
        ("/v1/rerank", "documents", assert_cohere_error),
        ("/v2/rerank", "documents", assert_cohere_error),
        ("/rerank", "texts", assert_tei_error),
    ],
)
def test_body_over_8_mib_is_413(http, route, field, assert_error):
    huge = "x " * (MAX_BODY_BYTES // 2 + 1024)
    body = {"model": MODEL, "query": QUERY, field: [huge]}
    assert_error(http.post(route, json=body), 413)


def test_server_still_serves_after_bad_requests(http, server):
    assert server.is_running(), server.log_tail()
    good_embedding_request(http)
    response = http.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": TEXTS})
    assert response.status_code == 200, response.text
    assert http.get("/ready").status_code == 200


# load


def test_concurrent_requests_get_their_own_vectors(http, embed):
    requests = [
        [f"Request {index} asks about topic number {index * 7919 % 997}.", words(1 + index % 23, f"w{index}")]
        for index in range(48)
    ]
    alone = [embed(texts) for texts in requests]
    with ThreadPoolExecutor(max_workers=48) as pool:
        together = list(pool.map(embed, requests))
    for index, (expected, got) in enumerate(zip(alone, together)):
        assert got.shape == expected.shape
        for row in range(len(expected)):
            assert cosine(got[row], expected[row]) >= SAME_VECTOR, (index, row)


# a server started with other flags, which the tests below share (each flag checked on its own)
FLAGGED = ("--auto-truncate", "--served-model-name", "my-embedder", "--served-model-name", "alias2")


def test_auto_truncate_server_accepts_over_long_input(server_factory, embed):
    truncating = server_factory(*FLAGGED)
    with httpx.Client(base_url=truncating.url, timeout=120.0, trust_env=False) as client:
        body = {"model": "my-embedder", "input": words(300), "encoding_format": "float"}
        response = client.post(EMBED_ROUTE, json=body)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["prompt_tokens"] == WINDOW
    vector = np.array(body["data"][0]["embedding"], dtype=np.float32)
    assert cosine(vector, embed(words(WINDOW - 2))[0]) >= SAME_VECTOR


def test_served_model_names(server_factory):
    named = server_factory(*FLAGGED)
    with httpx.Client(base_url=named.url, timeout=120.0, trust_env=False) as client:
        vectors = []
        for name in ("my-embedder", "alias2"):
            body = {"model": name, "input": TEXTS[0], "encoding_format": "float"}
            response = client.post(EMBED_ROUTE, json=body)
            assert response.status_code == 200, response.text
            assert response.json()["model"] == name
            vectors.append(np.array(response.json()["data"][0]["embedding"], dtype=np.float32))
        assert cosine(*vectors) >= SAME_VECTOR
        assert_openai_error(client.post(EMBED_ROUTE, json={"model": MODEL, "input": TEXTS[0]}), 404)
        models = client.get("/v1/models").json()["data"]
        assert sorted(model["id"] for model in models) == ["alias2", "my-embedder"]
