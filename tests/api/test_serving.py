"""Several models with names and aliases, a cross-encoder through rerank, auth, backpressure."""

import numpy as np
import pytest
import torch
from litestar.testing import TestClient
from transformers import AutoModelForSequenceClassification

from api.app import create_app
from api.config import ServerConfig
from api.server import Server
from engine.errors import Overloaded
from tests.conftest import build_cross_encoder, embedder_output

QUERY = "what do cats eat?"
DOCS = ["Cats eat meat and fish.", "The train leaves at noon.", "Kittens drink milk. " * 150]


@pytest.fixture(scope="module")
def cross_encoder_path(minilm_path, tmp_path_factory):
    return build_cross_encoder(minilm_path, tmp_path_factory.mktemp("ce"), num_labels=1, seed=3)


@pytest.fixture(scope="module")
def two_models(cross_encoder_path):
    config = ServerConfig(
        models=(None, str(cross_encoder_path)), served_model_names=(("embedder", "e2"), ("reranker",))
    )
    with TestClient(create_app(config)) as client:
        yield client


def test_each_name_reaches_its_model(two_models):
    names = {model["id"] for model in two_models.get("/v1/models").json()["data"]}
    assert names == {"embedder", "e2", "reranker"}
    assert two_models.post("/v1/embeddings", json={"model": "e2", "input": "hi"}).status_code == 200
    response = two_models.post("/v1/embeddings", json={"model": "reranker", "input": "hi"})
    assert response.status_code == 400 and "cannot embed" in response.json()["error"]["message"]
    response = two_models.post(
        "/v1/embeddings", json={"model": "sentence-transformers/all-MiniLM-L6-v2", "input": "hi"}
    )
    assert response.status_code == 404


def test_cross_encoder_scores_are_the_sigmoid_of_the_reference_logit(
    two_models, cross_encoder_path, minilm_tokenizer
):
    payload = two_models.post(
        "/v2/rerank", json={"model": "reranker", "query": QUERY, "documents": DOCS[:2]}
    ).json()
    reference = AutoModelForSequenceClassification.from_pretrained(cross_encoder_path).eval()
    expected = {}
    for index, doc in enumerate(DOCS[:2]):
        encoding = minilm_tokenizer.encode(QUERY, doc)
        with torch.no_grad():
            logit = reference(
                input_ids=torch.tensor([encoding.ids]), token_type_ids=torch.tensor([encoding.type_ids])
            ).logits[0, 0]
        expected[index] = torch.sigmoid(logit).item()
    for result in payload["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-4)


def test_cross_encoder_chunks_a_long_document_and_tei_raw_scores(two_models):
    payload = two_models.post(
        "/v1/rerank", json={"model": "reranker", "query": QUERY, "documents": DOCS}
    ).json()
    assert len(payload["results"]) == 3 and all(0 <= r["relevance_score"] <= 1 for r in payload["results"])
    # TEI's route takes the first model that can rerank: here the embedder (cosine, raw in [-1, 1])
    raw = two_models.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
    assert all(-1.0 <= rank["score"] <= 1.0 for rank in raw)


def test_api_key_is_required_except_for_health():
    with TestClient(create_app(ServerConfig(api_key="sekrit"))) as client:
        assert client.get("/health").status_code == 200
        response = client.post("/v1/embeddings", json={"input": "x"})
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
        response = client.post(
            "/v2/rerank", json={"query": "q", "documents": ["d"]}, headers={"authorization": "Bearer no"}
        )
        assert response.status_code == 401 and "message" in response.json()
        ok = client.post("/v1/embeddings", json={"input": "x"}, headers={"authorization": "Bearer sekrit"})
        assert ok.status_code == 200


class FullEngine:
    output = embedder_output()

    def estimate_seconds(self, num_tokens):
        return None

    def backlog_seconds(self, num_tokens):  # asked before anything is queued
        return None

    def enqueue(self, token_ids, token_type_ids=None, deadline=None, rows=None):
        raise Overloaded(queued_tokens=10, max_queue_tokens=10, retry_after_s=2)


def test_full_queue_is_429_with_retry_after_in_each_shape():
    server = Server(ServerConfig())
    with TestClient(create_app(server.config, server)) as client:
        model = server.registry().models[0]
        real_engine, model.engine = model.engine, FullEngine()
        try:
            response = client.post("/v1/embeddings", json={"input": "x"})
            assert response.status_code == 429 and response.headers["retry-after"] == "2"
            error = response.json()["error"]
            assert error["type"] == error["code"] == "rate_limit_exceeded"
            assert client.post("/v2/rerank", json={"query": "q", "documents": ["d"]}).status_code == 429
            assert (
                client.post("/rerank", json={"query": "q", "texts": ["d"]}).json()["error_type"]
                == "Overloaded"
            )
        finally:
            model.engine = real_engine
        assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 200


def test_concurrent_requests_get_their_own_vectors(client):
    import asyncio

    import httpx

    texts = [
        f"request number {i} is about {'cats' if i % 2 else 'stock markets'} " * (1 + i % 7)
        for i in range(48)
    ]
    alone = [
        np.asarray(client.post("/v1/embeddings", json={"input": t}).json()["data"][0]["embedding"])
        for t in texts
    ]

    async def main():
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://posy") as http:
            responses = await asyncio.gather(*(http.post("/v1/embeddings", json={"input": t}) for t in texts))
        return [np.asarray(r.json()["data"][0]["embedding"]) for r in responses]

    together = asyncio.run(main())
    for one, other in zip(alone, together):
        assert float(one @ other) >= 0.9999


def test_a_stopped_engine_makes_ready_and_model_requests_a_503_with_retry_after():
    server = Server(ServerConfig())
    with TestClient(create_app(server.config, server)) as client:
        assert client.get("/ready").status_code == 200
        server.registry().models[0].engine.stop()  # as if its only replica were gone
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "5"
        assert "no engine replica of" in ready.json()["error"]["message"]
        for path, body in (("/v1/embeddings", {"input": "x"}), ("/rerank", {"query": "q", "texts": ["d"]})):
            response = client.post(path, json=body)
            assert response.status_code == 503 and response.headers["retry-after"] == "5", response.text
        server.draining = True
        draining = client.post("/v2/rerank", json={"query": "q", "documents": ["d"]})
        assert draining.status_code == 503 and draining.headers["retry-after"] == "1"
        assert client.get("/ready").json()["error"]["message"] == "draining"
