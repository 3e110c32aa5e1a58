"""Cohere v1/v2 and TEI rerank on the bundled embedding model (scores are (1 + cosine) / 2)."""

import pytest

QUERY = "How do I bake sourdough bread?"
DOCS = [
    "The stock market closed higher on Friday.",
    "To bake sourdough bread, feed your starter, mix the dough, let it rise overnight and bake it hot.",
    "Cats sleep for most of the day.",
]
FILLER = " ".join(
    f"Paragraph {i} talks about the history of railways in distant countries." for i in range(60)
)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_results_sorted_with_scores_in_unit_interval(client, path):
    response = client.post(path, json={"model": "all-MiniLM-L6-v2", "query": QUERY, "documents": DOCS})
    assert response.status_code == 200, response.text
    payload = response.json()
    scores = [result["relevance_score"] for result in payload["results"]]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    assert payload["results"][0]["index"] == 1
    assert all("document" not in result for result in payload["results"])
    assert payload["id"] and payload["meta"]["api_version"]["version"] == path[2]


def test_top_n_and_return_documents(client):
    payload = client.post(
        "/v2/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True}
    ).json()
    assert [result["document"]["text"] for result in payload["results"]] == [
        DOCS[1],
        payload["results"][1]["document"]["text"],
    ]
    assert len(payload["results"]) == 2


def test_v1_objects_with_rank_fields_are_returned_whole(client):
    documents = [{"title": "Bread", "text": DOCS[1], "id": 7}, {"title": "Markets", "text": DOCS[0], "id": 8}]
    payload = client.post(
        "/v1/rerank",
        json={
            "query": QUERY,
            "documents": documents,
            "rank_fields": ["title", "text"],
            "return_documents": True,
        },
    ).json()
    assert payload["results"][0]["document"] == documents[0]


def test_long_document_with_the_answer_at_its_end_ranks_first(client):
    long_doc = FILLER + " " + DOCS[1]
    documents = [DOCS[0], long_doc, DOCS[2]]
    for path in ("/v1/rerank", "/v2/rerank"):
        payload = client.post(path, json={"query": QUERY, "documents": documents}).json()
        assert payload["results"][0]["index"] == 1, path
    # with one chunk only, the answer is cut off and the document loses
    payload = client.post(
        "/v1/rerank", json={"query": QUERY, "documents": documents, "max_chunks_per_doc": 1}
    ).json()
    assert payload["results"][0]["index"] != 1


def test_scores_are_cosine_mapped_to_unit_interval(client):
    import numpy as np

    vectors = client.post("/v1/embeddings", json={"input": [QUERY, DOCS[1]]}).json()["data"]
    query, doc = (np.asarray(item["embedding"]) for item in vectors)
    score = client.post("/v2/rerank", json={"query": QUERY, "documents": [DOCS[1]]}).json()["results"][0]
    assert score["relevance_score"] == pytest.approx((1 + query @ doc) / 2, abs=1e-5)


def test_tei_rerank_shape(client):
    response = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert response.status_code == 200
    ranks = response.json()
    assert ranks[0]["index"] == 1
    assert ranks[0]["text"] == DOCS[1] and set(ranks[0]) == {"index", "score", "text"}
    raw = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
    assert set(raw[0]) == {"index", "score"}
    # raw scores are the cosine itself: the mapped score is (1 + raw) / 2
    mapped = {rank["index"]: rank["score"] for rank in ranks}
    assert all(mapped[rank["index"]] == pytest.approx((1 + rank["score"]) / 2, abs=1e-6) for rank in raw)


def test_legacy_fields_are_ignored(client):
    body = {
        "query": QUERY,
        "documents": DOCS,
        "return_documents": False,
        "max_chunks_per_doc": 3,
        "version": 2,
    }
    assert client.post("/v1/rerank", json=body).status_code == 200
