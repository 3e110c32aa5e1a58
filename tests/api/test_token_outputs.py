"""Token-level outputs through HTTP, one server with three tiny random models (ColBERT in PyLate's layout,
SPLADE, bge-m3), each checked against its reference package in fp32: vLLM's /pooling (token_embed, embed,
bge-m3's "all"), TEI's /embed_sparse, rerank and /score by MaxSim on a ColBERT model, and the errors a
client gets for a task its model does not serve."""

import base64

import numpy as np
import pytest
import torch
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from benchmarks.token_checkpoints import (
    QUERY_LENGTH,
    colbert_ai_checkpoint,
    colbert_checkpoints,
    flag_m3_embedder,
    m3_checkpoint,
    splade_checkpoint,
)
from scoring.late_interaction import max_sim

TOLERANCE = 1e-5
QUERY = "what do cats eat?"
DOCUMENTS = ["Cats eat fish, mostly.", "trains run on rails", "Dogs; cats! and fish?", "word " * 50]


@pytest.fixture(scope="module")
def folders(minilm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("token-models")
    colbert_ai, pylate = colbert_checkpoints(minilm_path, root / "colbert")
    return {
        "colbert": pylate,
        "colbert-ai": colbert_ai,
        "splade": splade_checkpoint(minilm_path, root / "splade"),
        "m3": m3_checkpoint(minilm_path, root / "m3"),
    }


@pytest.fixture(scope="module")
def client(folders):
    models = tuple(str(folders[name]) for name in ("colbert", "splade", "m3"))
    config = ServerConfig(models=models, served_model_names=(("colbert",), ("splade",), ("m3",)))
    with TestClient(create_app(config)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def colbert_reference(folders):
    checkpoint = colbert_ai_checkpoint(folders["colbert-ai"])
    with torch.inference_mode():
        query = checkpoint.queryFromText([QUERY])[0].numpy()
        documents = [document.numpy() for document in checkpoint.docFromText(DOCUMENTS, keep_dims=False)]
    return query, documents


def pooled(client, **body) -> list:
    response = client.post("/pooling", json=body)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["object"] == "list" and payload["usage"]["prompt_tokens"] > 0
    assert [item["index"] for item in payload["data"]] == list(range(len(payload["data"])))
    return [item["data"] for item in payload["data"]]


def test_pooling_gives_a_colbert_models_token_vectors(client, colbert_reference):
    query, documents = colbert_reference
    [got_query] = pooled(client, model="colbert", input=QUERY, input_type="query")
    assert len(got_query) == QUERY_LENGTH  # expanded to the query length
    np.testing.assert_allclose(got_query, query, atol=TOLERANCE)
    # token_embed is a ColBERT model's own task; a document is the default input type
    got_documents = pooled(client, model="colbert", input=DOCUMENTS, task="token_embed")
    for got, expected in zip(got_documents, documents):
        assert np.shape(got) == expected.shape  # punctuation left out
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    [encoded] = pooled(client, model="colbert", input=DOCUMENTS[0], encoding_format="base64")
    matrix = np.frombuffer(base64.b64decode(encoded), dtype="<f4").reshape(documents[0].shape)
    np.testing.assert_allclose(matrix, documents[0], atol=TOLERANCE)


def test_rerank_and_score_on_a_colbert_model_use_max_sim(client, colbert_reference):
    """Documents within the document length (a longer one is chunked: below)."""
    query, documents = colbert_reference
    texts, expected = DOCUMENTS[:3], max_sim(query, documents[:3])
    relevance = (1 + expected / QUERY_LENGTH) / 2  # the mean best cosine of the query's tokens, in [0, 1]
    response = client.post("/v2/rerank", json={"model": "colbert", "query": QUERY, "documents": texts})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [result["index"] for result in results] == list(np.argsort(-expected, kind="stable"))
    got = {result["index"]: result["relevance_score"] for result in results}
    np.testing.assert_allclose([got[i] for i in range(3)], relevance, atol=TOLERANCE)
    raw = client.post("/rerank", json={"query": QUERY, "texts": texts, "raw_scores": True}).json()
    by_index = sorted(raw, key=lambda item: item["index"])
    np.testing.assert_allclose([item["score"] for item in by_index], expected, atol=1e-4)
    score = client.post("/score", json={"model": "colbert", "queries": QUERY, "documents": texts})
    assert score.status_code == 200, score.text
    np.testing.assert_allclose([item["score"] for item in score.json()["data"]], relevance, atol=TOLERANCE)


def test_a_long_document_scores_its_best_chunk(client, colbert_reference):
    """A document past the 24-token document length is cut into chunks; it scores its best one, so an
    answer at its end still counts."""
    # 21 content tokens a chunk (24 less [CLS], [SEP] and the marker): the answer is the fourth chunk alone
    long_document = "word " * 63 + DOCUMENTS[0]
    body = {"model": "colbert", "query": QUERY, "documents": [long_document, DOCUMENTS[0], "word " * 20]}
    results = client.post("/v1/rerank", json=body).json()["results"]
    scores = {item["index"]: item["relevance_score"] for item in results}
    assert scores[0] == pytest.approx(scores[1], abs=TOLERANCE) and scores[0] > scores[2]


def test_embed_sparse_gives_splade_weights_as_sentence_transformers(client, folders):
    from sentence_transformers import SparseEncoder

    texts = [QUERY, DOCUMENTS[0]]
    response = client.post("/embed_sparse", json={"inputs": texts})
    assert response.status_code == 200, response.text
    expected = SparseEncoder(str(folders["splade"]), device="cpu").encode(texts, convert_to_tensor=True)
    for got, want in zip(response.json(), expected.to_dense().numpy()):
        indices = np.flatnonzero(want)
        assert [item["index"] for item in got] == indices.tolist()
        np.testing.assert_allclose(
            [item["value"] for item in got], want[indices], atol=TOLERANCE, rtol=TOLERANCE
        )


def test_bge_m3_serves_its_three_outputs_from_one_forward(client, folders):
    texts = [QUERY, DOCUMENTS[0], DOCUMENTS[2]]
    expected = flag_m3_embedder(folders["m3"]).encode(
        texts, return_dense=True, return_sparse=True, return_colbert_vecs=True
    )
    everything = pooled(client, model="m3", input=texts, task="all")
    dense = client.post("/v1/embeddings", json={"model": "m3", "input": texts}).json()["data"]
    colbert = pooled(client, model="m3", input=texts, task="token_embed")
    for index, item in enumerate(everything):
        np.testing.assert_allclose(item["dense_vecs"], expected["dense_vecs"][index], atol=TOLERANCE)
        np.testing.assert_allclose(dense[index]["embedding"], expected["dense_vecs"][index], atol=TOLERANCE)
        np.testing.assert_allclose(item["colbert_vecs"], expected["colbert_vecs"][index], atol=TOLERANCE)
        np.testing.assert_allclose(colbert[index], expected["colbert_vecs"][index], atol=TOLERANCE)
        lexical = {token: float(weight) for token, weight in expected["lexical_weights"][index].items()}
        assert sorted(item["lexical_weights"]) == sorted(lexical)
        for token, weight in lexical.items():
            assert item["lexical_weights"][token] == pytest.approx(weight, abs=TOLERANCE)


def test_embed_sparse_on_bge_m3_gives_its_lexical_weights(folders):
    with TestClient(create_app(ServerConfig(models=(str(folders["m3"]),)))) as client:
        response = client.post("/embed_sparse", json={"inputs": QUERY})
        assert response.status_code == 200, response.text
        everything = pooled(client, input=QUERY, task="all")[0]["lexical_weights"]
    assert {str(item["index"]): item["value"] for item in response.json()[0]} == pytest.approx(everything)


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/v1/embeddings", {"model": "colbert", "input": "a"}, "/pooling with task token_embed"),
        ("/v1/embeddings", {"model": "splade", "input": "a"}, "/embed_sparse"),
        ("/pooling", {"model": "splade", "input": "a", "task": "token_embed"}, "/embed_sparse"),
        ("/v1/rerank", {"model": "splade", "query": "a", "documents": ["b"]}, "sparse_embed"),
        ("/pooling", {"model": "colbert", "input": "a", "task": "all"}, "bge-m3"),
        ("/pooling", {"model": "colbert", "input": "a", "task": "sparse"}, "task"),
        ("/pooling", {"model": "colbert", "input": []}, "input"),
        ("/pooling", {"model": "colbert", "input": ["a", ""]}, "input"),
    ],
)
def test_a_task_the_model_does_not_serve_is_a_400_naming_what_it_serves(client, path, body, named):
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    message = (
        response.json()["error"]["message"] if "error" in response.json() else response.json()["message"]
    )
    assert named in message
    assert client.get("/health").status_code == 200


def test_token_vectors_past_what_a_response_holds_are_refused_before_the_model_runs(folders):
    """bge-m3's token vectors (32 wide in this checkpoint, 33 with the weight) of 4,500 texts of its
    126-token window: 18.1 million floats, past the 16.8 million one response holds (about 0.5 GB of Python
    floats as JSON lists); within --max-inputs and --max-request-tokens."""
    texts = ["word " * 124] * 4500
    config = ServerConfig(models=(str(folders["m3"]),), max_inputs=len(texts))
    with TestClient(create_app(config)) as client:
        # token_embed: the token vectors; all: the whole token rows, a vector and a lexical weight each
        for task, width in (("token_embed", 32), ("all", 33)):
            response = client.post("/pooling", json={"input": texts, "task": task})
            assert response.status_code == 400, response.text[:500]
            error = response.json()["error"]
            assert error["param"] == "input" and f"567000 tokens x {width} " in error["message"], error
            assert "fewer or shorter" in error["message"]
            assert len(pooled(client, input=texts[:16], task=task)) == 16  # within it: served


def test_splade_rows_past_what_a_request_holds_are_teis_413_before_the_model_runs(folders):
    """A SPLADE model's engine rows are its vocabulary's weights (30,522 here), a text each: 2,300 texts
    are 70.2 million floats, past the 67.1 million of one request."""
    texts = ["a"] * 2300
    config = ServerConfig(models=(str(folders["splade"]),), max_inputs=len(texts))
    with TestClient(create_app(config)) as client:
        response = client.post("/embed_sparse", json={"inputs": texts})
        assert response.status_code == 413, response.text[:500]
        assert response.json()["error_type"] == "Validation"
        assert "2300 texts x 30522 " in response.json()["error"]
        # within it: served (16 texts: 2,000 were, and took a minute of CI's CPU)
        within = client.post("/embed_sparse", json={"inputs": texts[:16]})
        assert within.status_code == 200 and len(within.json()) == 16


def test_embed_sparse_on_a_dense_model_is_teis_422(minilm_path):
    with TestClient(create_app(ServerConfig())) as client:
        response = client.post("/embed_sparse", json={"inputs": "a"})
        assert response.status_code == 422
        assert response.json()["error_type"] == "Validation" and "/v1/embeddings" in response.json()["error"]
        response = client.post("/pooling", json={"input": "a", "task": "token_embed"})
        assert response.status_code == 400 and "embed (/v1/embeddings)" in response.json()["error"]["message"]
        # a dense embedder's /pooling embed is its /v1/embeddings vector
        pooled_vector = pooled(client, input="hello world")[0]
        vector = client.post("/v1/embeddings", json={"input": "hello world"}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(pooled_vector, vector, atol=1e-6)


def test_models_list_the_token_tasks(client):
    tasks = {model["id"]: model["tasks"] for model in client.get("/v1/models").json()["data"]}
    assert tasks == {
        "colbert": ["token_embed", "rerank", "score", "pooling"],
        "splade": ["sparse_embed"],
        "m3": ["embed", "token_embed", "sparse_embed", "rerank", "score", "pooling"],
    }
