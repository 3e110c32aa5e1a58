"""Listwise rerank (jina-reranker-v3's JinaForRanking) through HTTP against transformers, fp32 on the CPU:
a tiny random Qwen3 with the projector, a byte-level BPE tokenizer holding the markers; the reference
lays out the model card's prompt itself, runs transformers' Qwen3Model over it and scores each document
by the cosine of its marker's projected state and the query's."""

import asyncio

import numpy as np
import pytest
from litestar.testing import TestClient

import scoring.listwise
from api.app import create_app
from api.config import ServerConfig
from benchmarks.token_checkpoints import listwise_checkpoint, listwise_reference
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.checkpoint.source import ModelFlags, ModelSource
from engine.config import EngineConfig
from engine.replicas.replica_set import ReplicaSet
from scoring.listwise import ListwisePrompt, _blocks

TOLERANCE = 1e-5
QUERY = "what do cats eat?"
DOCUMENTS = [
    "Cats eat fish, mostly.",
    "trains run on rails",
    "\nParis is the capital of France.",
    "  The weather is cold today",
    " ",  # whitespace only (an empty document is a 400)
]


def reference_prompt(query: str, documents: list[str], instruction: str | None = None) -> str:
    """The prompt as jina-reranker-v3's model card lays it out."""
    system = (
        "You are a search relevance expert who can determine a ranking of the passages based on how "
        "relevant they are to the query. If the query is a question, how relevant a passage is depends on "
        "how well it answers the question. If not, try to analyze the intent of the query and assess how "
        "well each passage satisfies the intent. If an instruction is provided, you should follow the "
        "instruction when determining the ranking."
    )
    user = (
        f"I will provide you with {len(documents)} passages, each indicated by a numerical identifier. "
        f"Rank the passages based on their relevance to query: {query}\n"
    )
    if instruction:
        user += f"<instruct>\n{instruction}\n</instruct>\n"
    user += "\n".join(
        f'<passage id="{index}">\n{document}<|embed_token|>\n</passage>'
        for index, document in enumerate(documents)
    )
    user += f"\n<query>\n{query}<|rerank_token|>\n</query>"
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return listwise_checkpoint(tmp_path_factory.mktemp("listwise") / "jina")


@pytest.fixture(scope="module")
def reference(folder):
    tokenizer, vectors = listwise_reference(folder)

    def cosines(query: str, documents: list[str], instruction: str | None = None) -> np.ndarray:
        rows = vectors(tokenizer.encode(reference_prompt(query, documents, instruction)).ids)
        assert len(rows) == len(documents) + 1
        return (rows[:-1] @ rows[-1]).numpy()

    return tokenizer, cosines


@pytest.fixture(scope="module")
def client(folder):
    config = ServerConfig(models=(str(folder),), served_model_names=(("jina",),))
    with TestClient(create_app(config)) as test_client:
        yield test_client


def raw_scores(client, query, texts, **body) -> np.ndarray:
    response = client.post("/rerank", json={"query": query, "texts": texts, "raw_scores": True, **body})
    assert response.status_code == 200, response.text
    return np.array([item["score"] for item in sorted(response.json(), key=lambda item: item["index"])])


def test_rerank_scores_each_document_by_the_cosine_to_the_query_in_one_prompt(client, reference):
    _, cosines = reference
    expected = cosines(QUERY, DOCUMENTS)
    np.testing.assert_allclose(raw_scores(client, QUERY, DOCUMENTS), expected, atol=TOLERANCE)
    response = client.post("/v2/rerank", json={"model": "jina", "query": QUERY, "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [item["index"] for item in results] == np.argsort(-expected, kind="stable").tolist()
    relevance = {item["index"]: item["relevance_score"] for item in results}
    np.testing.assert_allclose(
        [relevance[i] for i in range(len(DOCUMENTS))], (1 + expected) / 2, atol=TOLERANCE
    )


def test_a_document_is_scored_among_the_others_not_alone(client, reference):
    """Listwise: the documents attend to each other, so a document's score depends on its company."""
    alone = raw_scores(client, QUERY, DOCUMENTS[:1])
    among = raw_scores(client, QUERY, DOCUMENTS)
    np.testing.assert_allclose(alone, reference[1](QUERY, DOCUMENTS[:1]), atol=TOLERANCE)
    assert abs(alone[0] - among[0]) > 1e-3


def test_an_instruction_goes_into_the_prompt(client, reference):
    instruction = "Prefer passages about fish."
    body = {"model": "jina", "query": QUERY, "documents": DOCUMENTS, "instruction": instruction}
    response = client.post("/v2/rerank", json=body)
    assert response.status_code == 200, response.text
    relevance = {item["index"]: item["relevance_score"] for item in response.json()["results"]}
    expected = (1 + reference[1](QUERY, DOCUMENTS, instruction)) / 2
    np.testing.assert_allclose([relevance[i] for i in range(len(DOCUMENTS))], expected, atol=TOLERANCE)


def test_marker_strings_in_the_texts_are_removed(client, reference):
    """A marker written into a text would add a row: it is removed, as the model's own code does (also
    where removing one joins another)."""
    documents = ["Cats <|embed_<|rerank_token|>token|>eat fish", "trains<|rerank_token|>"]
    clean = ["Cats eat fish", "trains"]
    np.testing.assert_allclose(
        raw_scores(client, QUERY + "<|embed_token|>", documents), reference[1](QUERY, clean), atol=TOLERANCE
    )


def test_documents_past_a_prompts_limit_go_to_more_prompts_each_with_the_query(
    client, reference, monkeypatch
):
    monkeypatch.setattr(scoring.listwise, "MAX_DOCUMENTS_PER_PROMPT", 2)
    expected = np.concatenate([reference[1](QUERY, DOCUMENTS[start : start + 2]) for start in (0, 2, 4)])
    np.testing.assert_allclose(raw_scores(client, QUERY, DOCUMENTS), expected, atol=TOLERANCE)


def test_documents_are_cut_to_max_tokens_per_doc(client, reference):
    tokenizer, cosines = reference
    documents = ["Cats eat fish and the weather is cold today. " * 40, DOCUMENTS[1]]
    cut = [tokenizer.decode(tokenizer.encode(text).ids[:7], skip_special_tokens=False) for text in documents]
    body = {"model": "jina", "query": QUERY, "documents": documents, "max_tokens_per_doc": 7}
    response = client.post("/v2/rerank", json=body)
    assert response.status_code == 200, response.text
    relevance = {item["index"]: item["relevance_score"] for item in response.json()["results"]}
    np.testing.assert_allclose([relevance[0], relevance[1]], (1 + cosines(QUERY, cut)) / 2, atol=TOLERANCE)


def test_documents_that_overrun_the_window_are_split_over_prompts_that_fit(folder):
    """A 400-token window: twelve documents of ~60 tokens need several prompts, each within it."""
    config = ServerConfig(models=(str(folder),), model_flags=ModelFlags(max_model_len=400))
    documents = [
        f"{index} cats eat fish and the weather is cold today, rain is coming" * 3 for index in range(12)
    ]
    with TestClient(create_app(config)) as client:
        scores = raw_scores(client, QUERY, documents)
        assert np.isfinite(scores).all() and len(scores) == 12
        # cut to its 512 tokens, a query still leaves no room in this window: a 4xx that says so
        response = client.post("/rerank", json={"query": "x " * 600, "texts": documents[:1]})
        assert response.status_code == 422 and "leaves no room" in response.json()["error"]
        assert client.post("/rerank", json={"query": QUERY, "texts": documents[:1]}).status_code == 200


def test_other_tasks_are_a_400_naming_rerank(client):
    response = client.post("/v1/embeddings", json={"model": "jina", "input": "hello"})
    assert response.status_code == 400
    assert "rerank (/v1/rerank)" in response.json()["error"]["message"]


def test_blocks_hold_documents_within_the_budget_and_the_count():
    assert _blocks([3, 3, 3, 3], budget=7) == [(0, 2), (2, 4)]
    assert _blocks([10, 1], budget=7) == [(0, 1), (1, 2)]  # an over-size one alone (the caller cut it)
    assert _blocks([1] * 130, budget=1000) == [(0, 125), (125, 130)]


def test_the_prompt_is_the_model_cards():
    prompt = ListwisePrompt()
    assert prompt.text("q", ["a", "b"], "be kind") == reference_prompt("q", ["a", "b"], "be kind")
    assert prompt.sanitized("a<|embed_<|rerank_token|>token|>b") == "ab"


def test_replica_processes_give_the_marker_rows_of_the_engine_in_process(folder, reference):
    """Prompts spread over two replicas in batches of at most 2,048 tokens: each prompt's rows come back in
    order, as from the engine in the gateway's process."""
    tokenizer, _ = reference
    prompts = [tokenizer.encode(reference_prompt(QUERY, DOCUMENTS[:n])).ids for n in (1, 3, 5, 2)]
    config = EngineConfig(max_batch_tokens=2048, max_queue_tokens=10**5, dtype="float32")
    engine = build_engine(resolve_model(str(folder)), config)
    replica_set = ReplicaSet(ModelSource(str(folder)), 2, config)
    replica_set.start()

    async def both():
        return await engine.run(prompts), await replica_set.pool.run(prompts)

    try:
        in_process, replicated = asyncio.run(asyncio.wait_for(both(), 120))
    finally:
        engine.stop()
        replica_set.stop()
    assert in_process.shape == (2 + 4 + 6 + 3, 512)
    np.testing.assert_allclose(replicated, in_process, atol=TOLERANCE)


def test_score_ranks_a_query_against_its_documents_in_one_prompt(client, reference):
    """vLLM's /score, one query to many documents: each document's relevance, (1 + cosine) / 2 of the
    listwise prompt that holds them all, as rerank's."""
    _, cosines = reference
    documents = DOCUMENTS
    response = client.post("/score", json={"model": "jina", "text_1": QUERY, "text_2": documents})
    assert response.status_code == 200, response.text
    data = sorted(response.json()["data"], key=lambda item: item["index"])
    np.testing.assert_allclose(
        [item["score"] for item in data], (1 + cosines(QUERY, documents)) / 2, atol=TOLERANCE
    )
    assert response.json()["usage"]["prompt_tokens"] > 0
