"""7M characters without a space (issue 38), on every route family: cut before it is tokenized to what its
window reads (api/char_bound.py), so that it costs what a window costs; with truncation (asked for, or the
API's default) it is answered as its whole text's tokens truncated are, [CLS] [UNK] [SEP] for the bundled
WordPiece (a word past 100 characters is one [UNK]); without, it is refused in the API's error shape."""

import numpy as np
import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from api.tokenize import TextEncoder
from tests.api.test_hostile_input import COHERE_V1, COHERE_V2, OPENAI, TEI, assert_error, assert_ok
from tests.conftest import build_cross_encoder

SPACELESS = "a" * 7_000_000
WHOLE_IDS = [101, 100, 102]  # the whole text's tokens: [CLS] [UNK] [SEP]
# what the bundled model's 256-token window reads at 100 characters a token (its longest: an [UNK] word)
MAX_CHARS = 258 * 100


@pytest.fixture
def longest_tokenized(monkeypatch) -> list[int]:
    """The lengths of the texts the tokenizer is given during the test."""
    seen: list[int] = []
    content_ids = TextEncoder.content_ids
    monkeypatch.setattr(
        TextEncoder,
        "content_ids",
        lambda self, texts: seen.extend(map(len, texts)) or content_ids(self, texts),
    )
    return seen


def vector_of_ids(client) -> np.ndarray:
    payload = assert_ok(client.post(OPENAI, json={"input": [WHOLE_IDS]}))
    return np.asarray(payload["data"][0]["embedding"])


@pytest.mark.parametrize(
    "route, refused, truncated, vector_at",
    [
        (OPENAI, {}, {"truncate_prompt_tokens": -1}, lambda p: p["data"][0]["embedding"]),
        (OPENAI, {}, {"truncate_prompt_tokens": 256}, lambda p: p["data"][0]["embedding"]),
        ("/v2/embed", {"truncate": "NONE"}, {}, lambda p: p["embeddings"]["float"][0]),  # END by default
        ("/v2/embed", {"truncate": "NONE"}, {"truncate": "START"}, lambda p: p["embeddings"]["float"][0]),
        ("/embed", {}, {"truncate": True}, lambda p: p[0]),
        ("/embed", {"truncate": False}, {"truncate": True, "truncation_direction": "Left"}, lambda p: p[0]),
        ("/pooling", {}, {"truncate_prompt_tokens": -1}, lambda p: p["data"][0]["data"]),
    ],
)
def test_an_embedding_is_of_the_whole_texts_tokens_truncated_or_refused(
    client, longest_tokenized, route, refused, truncated, vector_at
):
    field = {"/v2/embed": "texts", "/embed": "inputs"}.get(route, "input")
    texts = [SPACELESS] if route == "/v2/embed" else SPACELESS
    response = client.post(route, json={field: texts, **refused})
    shape_of = {"/v2/embed": COHERE_V2, "/embed": TEI}.get(route, OPENAI)
    assert_error(response, shape_of, 400, "input 0 has 7000000 characters, more than the 25600 that")
    assert not longest_tokenized  # refused untokenized
    payload = assert_ok(client.post(route, json={field: texts, **truncated}))
    np.testing.assert_allclose(vector_at(payload), vector_of_ids(client), atol=1e-6)
    assert max(longest_tokenized) <= MAX_CHARS


def test_late_chunking_cuts_or_refuses_a_chunk_on_its_characters(client, longest_tokenized):
    body = {"input": ["bread", SPACELESS], "late_chunking": True}
    assert_error(client.post(OPENAI, json=body), OPENAI, 400, "input 1 has 7000000 characters")
    payload = assert_ok(client.post(OPENAI, json={**body, "truncate_prompt_tokens": -1}))
    assert payload["usage"]["prompt_tokens"] == 4  # [CLS] bread [UNK] [SEP]
    assert max(longest_tokenized) <= MAX_CHARS


@pytest.mark.parametrize("route", [COHERE_V1, COHERE_V2, TEI, "/v1/score"])
def test_a_document_or_query_scores_as_its_whole_texts_tokens(client, longest_tokenized, route):
    """Rerank never refuses a long document: it is read as far as rerank reads it. A 7M-character query is
    one [UNK] token, as its whole text is, and fits."""

    def scores(query: str, documents: list[str]) -> list[float]:
        if route == "/v1/score":
            payload = assert_ok(client.post(route, json={"text_1": query, "text_2": documents}))
            return [item["score"] for item in payload["data"]]
        field = "texts" if route == TEI else "documents"
        payload = assert_ok(client.post(route, json={"query": query, field: documents}))
        results = payload if route == TEI else payload["results"]
        key = "score" if route == TEI else "relevance_score"
        return [item[key] for item in sorted(results, key=lambda item: item["index"])]

    one_unknown_word = "a" * 200  # one [UNK] too
    long, short = scores("bread", [SPACELESS, one_unknown_word])
    assert long == pytest.approx(short, abs=1e-6)
    [as_query] = scores(SPACELESS, ["bread"])
    assert as_query == pytest.approx(scores(one_unknown_word, ["bread"])[0], abs=1e-6)
    assert max(longest_tokenized) <= (4096 + 2) * 100  # v2's 4,096 tokens (v1's 10 windows: fewer)


def test_tokenize_refuses_a_text_past_its_windows_characters(client, longest_tokenized):
    response = client.post("/tokenize", json={"inputs": SPACELESS})
    assert_error(response, TEI, 400, "inputs[0] has 7000000 characters, more than the 25800 that")
    assert len(assert_ok(client.post("/tokenize", json={"inputs": "a" * 25_800}))[0]) == 3


def test_a_classifier_reads_the_whole_texts_tokens_truncated(minilm_path, tmp_path, longest_tokenized):
    folder = build_cross_encoder(minilm_path, tmp_path, num_labels=2)
    with TestClient(create_app(ServerConfig(models=(str(folder),)))) as client:
        longest_tokenized.clear()  # the start-up's
        response = client.post("/classify", json={"input": SPACELESS})
        assert_error(response, OPENAI, 400, "input 0 has 7000000 characters")
        assert not longest_tokenized
        truncated = assert_ok(
            client.post("/classify", json={"input": SPACELESS, "truncate_prompt_tokens": -1})
        )
        alike = assert_ok(client.post("/classify", json={"input": "a" * 200}))  # one [UNK] too
        assert truncated["data"][0]["probs"] == pytest.approx(alike["data"][0]["probs"], abs=1e-6)
        assert truncated["usage"]["prompt_tokens"] == 3
        # a cross-encoder scores the pair (query, document cut), too
        ranked = assert_ok(
            client.post("/v2/rerank", json={"query": "bread", "documents": [SPACELESS, "a" * 200]})
        )
        by_index = {item["index"]: item["relevance_score"] for item in ranked["results"]}
        assert by_index[0] == pytest.approx(by_index[1], abs=1e-6)
    assert max(longest_tokenized) <= 4098 * 100
