"""RAG frameworks pointed at a live server, each through its own documented class and nothing patched in
between: LangChain (OpenAIEmbeddings, CohereRerank), LlamaIndex (OpenAIEmbedding, CohereRerank) and
Haystack (the OpenAI text and document embedders, the TEI ranker). Each must return the vectors, or the
order and scores, that a direct call to the same route returns. Versions tested: see pyproject's test
extra (the frameworks' cohere pins meet at cohere 5.x)."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
import tiktoken

from .contract import MODEL, SAME_VECTOR, cosine

QUERY = "Where do emperor penguins raise their chicks?"
DOCS = [
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Emperor penguins raise their chicks on the Antarctic sea ice.",
    "Stock prices rose sharply after the earnings report.",
    "Penguin fathers keep the egg warm on their feet through the winter.",
    "The train to Berlin leaves from platform nine.",
]
TOP_N = 3
SAME_SCORE = 1e-5  # the frameworks pass the server's float32 scores through JSON


def assert_same_rows(rows, expected: np.ndarray) -> None:
    rows = np.asarray(rows, dtype=np.float32)
    assert rows.shape == expected.shape
    for row, want in zip(rows, expected):
        assert cosine(row, want) >= SAME_VECTOR


@pytest.fixture(scope="module")
def ranked(http) -> list[tuple[int, float]]:
    """(index, score) of the TOP_N best documents, best first, from a direct POST /v2/rerank."""
    body = {"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": TOP_N}
    response = http.post("/v2/rerank", json=body)
    assert response.status_code == 200, response.text
    results = [(item["index"], item["relevance_score"]) for item in response.json()["results"]]
    assert {index for index, _ in results[:2]} == {1, 3}  # the penguin sentences: a meaningful order
    return results


def assert_same_ranking(got: list[tuple[int, float]], expected: list[tuple[int, float]]) -> None:
    assert [index for index, _ in got] == [index for index, _ in expected]
    for (_, score), (_, want) in zip(got, expected):
        assert score == pytest.approx(want, abs=SAME_SCORE)


# LangChain


def test_langchain_openai_embeddings_equal_a_direct_call(base_url, embed):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=MODEL, base_url=f"{base_url}/v1", api_key="x", check_embedding_ctx_length=False, max_retries=0
    )
    assert_same_rows(embeddings.embed_documents(DOCS), embed(DOCS))
    assert_same_rows([embeddings.embed_query(QUERY)], embed([QUERY]))


def test_langchain_openai_embeddings_default_token_mode_gets_a_clear_400(base_url, monkeypatch):
    """By default LangChain tokenizes with tiktoken and sends the ids. tiktoken's files are a download, so
    a byte-level encoding stands in for cl100k_base: its ids are all inside MiniLM's vocabulary, the case
    that would otherwise embed other text without a word."""
    from langchain_openai import OpenAIEmbeddings

    ranks = {bytes([byte]): byte for byte in range(256)}
    byte_level = tiktoken.Encoding(name="bytes", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={})
    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda name: byte_level)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: byte_level)
    embeddings = OpenAIEmbeddings(model=MODEL, base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        embeddings.embed_documents(DOCS)
    assert "check_embedding_ctx_length=False" in raised.value.response.json()["error"]["message"]
    assert httpx.get(f"{base_url}/health", trust_env=False).status_code == 200


def test_langchain_cohere_rerank_equals_a_direct_call(base_url, ranked):
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(model=MODEL, base_url=base_url, cohere_api_key="x", top_n=TOP_N)
    results = reranker.rerank(DOCS, QUERY)
    assert_same_ranking([(item["index"], item["relevance_score"]) for item in results], ranked)
    documents = reranker.compress_documents([Document(page_content=text) for text in DOCS], QUERY)
    assert [document.page_content for document in documents] == [DOCS[index] for index, _ in ranked]


# LlamaIndex


def test_llamaindex_openai_embedding_equals_a_direct_call(base_url, embed):
    from llama_index.embeddings.openai import OpenAIEmbedding

    # model_name: a name of the server's, where `model` takes only OpenAI's own
    embedding = OpenAIEmbedding(model_name=MODEL, api_base=f"{base_url}/v1", api_key="x", max_retries=0)
    assert_same_rows(embedding.get_text_embedding_batch(DOCS), embed(DOCS))
    assert_same_rows([embedding.get_query_embedding(QUERY)], embed([QUERY]))


def test_llamaindex_cohere_rerank_equals_a_direct_call(base_url, ranked):
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(model=MODEL, base_url=base_url, api_key="x", top_n=TOP_N)
    nodes = [NodeWithScore(node=TextNode(text=text)) for text in DOCS]
    results = reranker.postprocess_nodes(nodes, QueryBundle(QUERY))
    got = [(DOCS.index(node.node.get_content()), node.score) for node in results]
    assert_same_ranking(got, ranked)


# Haystack


def test_haystack_openai_embedders_equal_a_direct_call(base_url, embed):
    from haystack import Document
    from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
    from haystack.utils import Secret

    options = {"api_key": Secret.from_token("x"), "model": MODEL, "api_base_url": f"{base_url}/v1"}
    text = OpenAITextEmbedder(**options).run(text=QUERY)
    assert_same_rows([text["embedding"]], embed([QUERY]))
    documents = OpenAIDocumentEmbedder(**options).run(documents=[Document(content=text) for text in DOCS])
    assert [document.content for document in documents["documents"]] == DOCS
    assert_same_rows([document.embedding for document in documents["documents"]], embed(DOCS))
    assert documents["meta"]["usage"]["prompt_tokens"] > 0


def test_haystack_tei_ranker_equals_a_direct_call(base_url, ranked):
    from haystack import Document
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker

    ranker = HuggingFaceTEIRanker(url=base_url, top_k=TOP_N)
    documents = ranker.run(query=QUERY, documents=[Document(content=text) for text in DOCS])["documents"]
    assert_same_ranking([(DOCS.index(document.content), document.score) for document in documents], ranked)
