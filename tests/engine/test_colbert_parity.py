"""ColBERT against colbert-ai (its Checkpoint's queryFromText / docFromText), fp32 on the CPU, one random
tiny BERT saved in colbert-ai's layout and in PyLate's: every query and kept document vector within 1e-5
(unit vectors, so cosine >= 0.9999). Queries are expanded with [MASK] tokens that attend but are no keys."""

import asyncio

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from benchmarks.token_checkpoints import (
    DOCUMENT_LENGTH,
    QUERY_LENGTH,
    colbert_ai_checkpoint,
    colbert_checkpoints,
)
from engine.attention import select_backend
from engine.batch import pack
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.outputs import RowRequest
from engine.weights import load_model
from scoring.late_interaction import LateInteraction, max_sim, split_rows
from scoring.templates import SingleTemplate

TOLERANCE = 1e-5
MAX_SIM_TOLERANCE = 1e-4  # a sum of up to 12 dot products, each within 1e-5
QUERIES = ["what do cats eat?", "a", "one two three four five six seven eight nine ten eleven twelve"]
DOCUMENTS = ["Cats eat fish, mostly.", "trains!", "word, " * 30, "Ünïcödé façade; 東京 🙂"]


@pytest.fixture(scope="module")
def folders(minilm_path, tmp_path_factory):
    return colbert_checkpoints(minilm_path, tmp_path_factory.mktemp("colbert"))


@pytest.fixture(scope="module")
def reference(folders):
    return colbert_ai_vectors(folders[0])


def colbert_ai_vectors(folder):
    checkpoint = colbert_ai_checkpoint(folder)
    with torch.inference_mode():
        queries = checkpoint.queryFromText(QUERIES)
        documents = checkpoint.docFromText(DOCUMENTS, keep_dims=False)
    return [query.numpy() for query in queries], [document.numpy() for document in documents]


def layout_of(spec) -> LateInteraction:
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return LateInteraction(spec.colbert, SingleTemplate.from_tokenizer(tokenizer)), tokenizer


def token_ids(spec):
    late, tokenizer = layout_of(spec)
    encodings = tokenizer.encode_batch(QUERIES + DOCUMENTS, add_special_tokens=False)
    content = [encoding.ids for encoding in encodings]
    queries = [late.query_ids(ids) for ids in content[: len(QUERIES)]]
    documents = [late.document_ids(ids) for ids in content[len(QUERIES) :]]
    return late, queries, documents


@pytest.mark.parametrize("layout", [0, 1], ids=["colbert-ai", "pylate"])
def test_colbert_vectors_match_colbert_ai(folders, reference, layout):
    assert_matches(folders[layout], reference)


@pytest.mark.parametrize("layout", [0, 1], ids=["colbert-ai", "pylate"])
def test_a_modernbert_colbert_matches_colbert_ai(minilm_path, tmp_path_factory, layout):
    """GTE-ModernColBERT's family: its 8-token local windows are shorter than a query, so the expansion
    tokens' windows count from their own positions over keys that end before them."""
    folders = colbert_checkpoints(minilm_path, tmp_path_factory.mktemp("modern-colbert"), modernbert=True)
    assert_matches(folders[layout], colbert_ai_vectors(folders[0]))


def assert_matches(folder, reference):
    spec = resolve_model(str(folder))
    assert spec.task == "token_embed" and spec.output_dim == 16
    assert (spec.colbert.query_length, spec.colbert.document_length) == (QUERY_LENGTH, DOCUMENT_LENGTH)
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    late, queries, documents = token_ids(spec)
    assert all(len(ids) == QUERY_LENGTH for ids in queries)  # cut or expanded to the query length
    with torch.inference_mode():
        rows = model(pack(queries + documents, output=model.output)).numpy()
    parts = split_rows(rows, [len(ids) for ids in queries + documents])
    expected_queries, expected_documents = reference
    for got, expected in zip(parts, expected_queries):
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    for ids, got, expected in zip(documents, parts[len(queries) :], expected_documents):
        kept = late.kept(ids, got, is_query=False)
        assert kept.shape == expected.shape  # punctuation dropped, as colbert-ai's skiplist drops it
        np.testing.assert_allclose(kept, expected, atol=TOLERANCE)


def test_expansion_tokens_as_keys_would_miss_the_reference(folders, reference):
    """The parity above can fail: with the [MASK] expansion as keys the real tokens' vectors change."""
    spec = resolve_model(str(folders[0]))
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    _, queries, _ = token_ids(spec)
    with torch.inference_mode():
        rows = model(pack(queries[:1])).numpy()
    assert np.abs(rows - reference[0][0]).max() > 100 * TOLERANCE


def test_the_engine_hands_each_request_its_token_rows_across_batches(folders, reference):
    """Requests cut over batches of 40 tokens, and several at once: each gets its sequences' token rows in
    order, as one forward gives them."""
    spec = resolve_model(str(folders[1]))
    engine = build_engine(spec, EngineConfig(max_batch_tokens=40, max_queue_tokens=10**5, dtype="float32"))
    late, queries, documents = token_ids(spec)

    async def run_all():
        return await asyncio.gather(engine.run(queries), engine.run(documents), engine.run(documents[::-1]))

    try:
        query_rows, document_rows, reversed_rows = asyncio.run(run_all())
    finally:
        engine.stop()
    assert query_rows.shape == (len(queries) * QUERY_LENGTH, 16)
    for got, expected in zip(split_rows(query_rows, [len(ids) for ids in queries]), reference[0]):
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    for rows, order in ((document_rows, documents), (reversed_rows, documents[::-1])):
        parts = split_rows(rows, [len(ids) for ids in order])
        kept = [late.kept(ids, part, is_query=False) for ids, part in zip(order, parts)]
        expected = reference[1] if order is documents else reference[1][::-1]
        for got, want in zip(kept, expected):
            np.testing.assert_allclose(got, want, atol=TOLERANCE)


def test_the_engine_scores_documents_against_a_query_by_max_sim_across_batches(folders, reference):
    """A request's prefix is its query: each document's row is its MaxSim against the query's vectors
    (colbert-ai's), punctuation left out, computed by the engine in batches of
    40 tokens that each run the query, beside requests for token rows and for another query's scores."""
    spec = resolve_model(str(folders[1]))
    engine = build_engine(spec, EngineConfig(max_batch_tokens=40, max_queue_tokens=10**5, dtype="float32"))
    late, queries, documents = token_ids(spec)
    punctuation = late.document_ids(layout_of(spec)[1].encode("?!", add_special_tokens=False).ids)
    documents = [*documents, punctuation]

    async def run_all():
        return await asyncio.gather(
            engine.run(documents, rows=RowRequest(prefix=queries[0])),
            engine.run(documents),
            engine.run(documents[::-1], rows=RowRequest(prefix=queries[2])),
        )

    try:
        first, token_rows, third = asyncio.run(run_all())
    finally:
        engine.stop()
    assert first.shape == (len(documents), 16) and not first[:, 1:].any()
    # the punctuation-only document keeps its [CLS], [D] and [SEP] vectors, as colbert-ai does
    parts = split_rows(token_rows, [len(ids) for ids in documents])
    kept = [*reference[1], late.kept(punctuation, parts[-1], is_query=False)]
    assert len(kept[-1]) == 3
    np.testing.assert_allclose(first[:, 0], max_sim(reference[0][0], kept), atol=MAX_SIM_TOLERANCE)
    np.testing.assert_allclose(third[:, 0], max_sim(reference[0][2], kept[::-1]), atol=MAX_SIM_TOLERANCE)


def test_replicas_give_a_token_heads_rows_as_the_engine_in_process(folders):
    """Two replica processes, a request cut into chunks of at most 48 tokens: the rows come back by
    token, in order, as the in-process engine gives them (queries with their query-only expansion too);
    and MaxSim scores against a query that each chunk carries."""
    from engine.checkpoint.source import ModelSource
    from engine.replicas.replica_set import ReplicaSet

    spec = resolve_model(str(folders[1]))
    late, queries, documents = token_ids(spec)
    sequences = (queries + documents) * 8
    config = EngineConfig(max_batch_tokens=48, max_queue_tokens=10**5, dtype="float32")
    engine = build_engine(spec, config)
    replica_set = ReplicaSet(ModelSource(str(folders[1])), 2, config)
    replica_set.start()

    async def both():
        token_rows = await engine.run(sequences), await replica_set.pool.run(sequences)
        scored = RowRequest(prefix=queries[0])
        scores = await engine.run(documents * 8, rows=scored)
        return token_rows, (scores, await replica_set.pool.run(documents * 8, rows=scored))

    try:
        (in_process, replicated), (scores, replicated_scores) = asyncio.run(asyncio.wait_for(both(), 120))
    finally:
        engine.stop()
        replica_set.stop()
    assert replicated.shape == in_process.shape == (sum(map(len, sequences)), 16)
    np.testing.assert_allclose(replicated, in_process, atol=TOLERANCE)
    assert replicated_scores.shape == scores.shape == (len(documents) * 8, 16)  # MaxSim scores, a row each
    np.testing.assert_allclose(replicated_scores, scores, atol=TOLERANCE)
