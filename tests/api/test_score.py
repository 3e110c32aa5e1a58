"""/score and /v1/score (vLLM's score API): pairing one to one, one to many and many to many; an
embedding model scores by cosine, a cross-encoder as its rerank relevance; usage and errors."""

import numpy as np
import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from tests.conftest import build_cross_encoder

QUERY = "A man is playing a guitar."
DOCS = ["Someone plays an instrument.", "The stock market fell today.", "A person strums a guitar."]


def vectors(client, texts) -> np.ndarray:
    response = client.post("/v1/embeddings", json={"input": texts})
    return np.array([item["embedding"] for item in response.json()["data"]])


def scored(client, path="/score", **body) -> dict:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["object"] == "list" and payload["id"].startswith("score-")
    assert [item["index"] for item in payload["data"]] == list(range(len(payload["data"])))
    assert all(item["object"] == "score" for item in payload["data"])
    return payload


def test_an_embedding_model_scores_pairs_by_cosine(client):
    query, docs = vectors(client, [QUERY])[0], vectors(client, DOCS)
    cosines = docs @ query / np.linalg.norm(docs, axis=1) / np.linalg.norm(query)
    one = scored(client, text_1=QUERY, text_2=DOCS[0])
    assert len(one["data"]) == 1 and one["data"][0]["score"] == pytest.approx(cosines[0], abs=1e-5)
    many = scored(client, "/v1/score", text_1=QUERY, text_2=DOCS)
    np.testing.assert_allclose([item["score"] for item in many["data"]], cosines, atol=1e-5)
    pairwise = scored(client, text_1=[QUERY, DOCS[1]], text_2=[DOCS[0], DOCS[1]])
    assert pairwise["data"][0]["score"] == pytest.approx(cosines[0], abs=1e-5)
    assert pairwise["data"][1]["score"] == pytest.approx(1.0, abs=1e-5)  # a text with itself


def test_usage_counts_each_distinct_text_1_once_and_every_text_2(client):
    usage = scored(client, text_1=QUERY, text_2=DOCS)["usage"]
    expected = client.post("/v1/embeddings", json={"input": [QUERY, *DOCS]}).json()["usage"]["prompt_tokens"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == expected


def test_a_cross_encoder_scores_pairs_as_its_rerank_relevance(minilm_path, tmp_path):
    folder = build_cross_encoder(minilm_path, tmp_path)
    with TestClient(create_app(ServerConfig(models=(str(folder),)))) as client:
        ranked = client.post("/v2/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
        relevance = {result["index"]: result["relevance_score"] for result in ranked}
        payload = scored(client, text_1=QUERY, text_2=DOCS)
        assert [item["score"] for item in payload["data"]] == pytest.approx([relevance[i] for i in range(3)])
        pairwise = scored(client, text_1=[QUERY, QUERY], text_2=DOCS[:2])
        assert [item["score"] for item in pairwise["data"]] == pytest.approx([relevance[0], relevance[1]])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
        ({"text_1": [], "text_2": "b"}, "text_1"),
        ({"text_1": "a", "text_2": ["b", ""]}, "text_2"),
        ({"text_1": "a"}, "text_2"),
        ({"text_1": "a", "text_2": "b", "model": "no-such-model"}, None),
    ],
)
def test_bad_requests_get_an_openai_shaped_4xx(client, body, param):
    response = client.post("/score", json=body)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["message"] and (param is None or param in error["message"] or error["param"] == param)


def test_a_judge_scores_several_queries_at_once_and_counts_the_tokens_it_ran(tmp_path):
    # a causal judge runs each query's prompt once a batch for its documents: pairwise scores equal each
    # pair alone, and usage counts what ran (each query's group once its prompt, not once a document)
    from tests.engine.test_qwen3_parity import save_random_qwen3

    save_random_qwen3(tmp_path, "Qwen3ForCausalLM")
    first, second = "what do cats eat", "where is the train station"
    docs = ["fish and mice", "the station is north of the river", "trains leave hourly", "cats sleep"]
    with TestClient(create_app(ServerConfig(models=(str(tmp_path),)))) as client:
        pairwise = scored(client, text_1=[first, first, second, second], text_2=docs)
        queries = [first, first, second, second]
        alone = [scored(client, text_1=query, text_2=doc) for query, doc in zip(queries, docs)]
        groups = [scored(client, text_1=first, text_2=docs[:2])]
        groups.append(scored(client, text_1=second, text_2=docs[2:]))
    expected = [payload["data"][0]["score"] for payload in alone]
    assert [item["score"] for item in pairwise["data"]] == pytest.approx(expected, abs=1e-5)
    assert np.ptp(expected) > 100 * 1e-5  # the scores differ: the comparison can fail
    tokens = [payload["usage"]["prompt_tokens"] for payload in (pairwise, *alone, *groups)]
    assert tokens[0] == tokens[5] + tokens[6]
    # each group ran its query's prompt once: fewer tokens than its pairs alone
    assert tokens[5] < tokens[1] + tokens[2] and tokens[6] < tokens[3] + tokens[4]


def test_vllms_other_names_of_the_two_sides_score_alike(client):
    expected = scored(client, text_1=QUERY, text_2=DOCS)["data"]
    for first, second in (("queries", "documents"), ("data_1", "data_2")):
        assert scored(client, **{first: QUERY, second: DOCS})["data"] == expected


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"text_1": "a", "documents": ["b"]}, "not several"),
        ({"queries": "a"}, "documents"),
        ({"data_2": ["a"]}, "data_1"),
        ({}, "text_1 and text_2"),
    ],
)
def test_sides_given_by_two_names_or_by_half_are_a_400(client, body, named):
    response = client.post("/score", json=body)
    assert response.status_code == 400, response.text
    assert named in response.json()["error"]["message"]
