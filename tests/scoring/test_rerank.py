"""Chunking, score heads and rerank_scores over a fake engine."""

import asyncio

import numpy as np
import pytest

from engine.outputs import ALL_ROWS
from engine.prefixes import prefix_pays
from scoring.chunking import max_over_chunks, split_into_chunks
from scoring.errors import QueryTooLong, TooManyChunks
from scoring.heads import cosine_to_scores, logits_to_scores
from scoring.rerank import RerankModel, RerankOptions, document_lead, rerank_scores
from scoring.templates import QWEN3_JUDGE, QWEN3_VL_JUDGE, PairTemplate, Piece, SingleTemplate, TextPrompts

CLS, SEP = 101, 102
SINGLE = SingleTemplate(Piece((CLS,), (0,)), Piece((SEP,), (0,)))
PAIR = PairTemplate(Piece((CLS,), (0,)), Piece((SEP,), (0,)), Piece((SEP,), (1,)), 0, 1)


def test_split_into_chunks():
    assert split_into_chunks(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert split_into_chunks(list(range(7)), 3, max_chunks=2) == [[0, 1, 2], [3, 4, 5]]
    assert split_into_chunks([], 3) == [[]]
    # a document's lead (its prompt's tokens, 8 9 here) starts each chunk after the first too
    assert split_into_chunks([8, 9, 1, 2, 3, 4], 4, lead=(8, 9)) == [[8, 9, 1, 2], [8, 9, 3, 4]]
    assert split_into_chunks([8, 9, 1, 2, 3, 4, 5], 4, max_chunks=2, lead=(8, 9)) == [
        [8, 9, 1, 2],
        [8, 9, 3, 4],
    ]
    assert split_into_chunks([8, 9, 1], 4, lead=(8, 9)) == [[8, 9, 1]]
    # a lead that leaves no room for the document's tokens is not repeated
    assert split_into_chunks([8, 9, 1, 2, 3], 2, lead=(8, 9)) == [[8, 9], [1, 2], [3]]
    # a laid-out text's closing tokens (0 0 here) end each chunk before the last too
    closing = (0, 0)
    assert split_into_chunks([8, 9, 1, 2, 3, 4, 0, 0], 5, lead=(8, 9), closing=closing) == [
        [8, 9, 1, 0, 0],
        [8, 9, 2, 0, 0],
        [8, 9, 3, 0, 0],
        [8, 9, 4, 0, 0],
    ]
    assert split_into_chunks([1, 2, 3, 0, 0], 4, max_chunks=1, closing=closing) == [[1, 2, 0, 0]]
    assert split_into_chunks([1, 2, 0, 0], 4, closing=closing) == [[1, 2, 0, 0]]  # fits: one chunk
    # not where the text does not end with them, nor where they leave no room
    assert split_into_chunks([1, 2, 3, 4], 3, closing=closing) == [[1, 2, 3], [4]]
    assert split_into_chunks([1, 2, 0, 0], 2, closing=closing) == [[1, 2], [0, 0]]


def test_a_documents_lead_is_its_laid_out_text_before_it():
    assert document_lead(TextPrompts("query: ", "passage: ")) == "passage:"
    assert document_lead(TextPrompts()) == ""
    assert document_lead(QWEN3_VL_JUDGE) == ">:"
    assert document_lead(QWEN3_JUDGE) == ""  # a space: the document's first word starts with it


def test_max_over_chunks():
    scores = max_over_chunks(np.array([0.1, 0.9, 0.3, 0.2]), np.array([0, 0, 1, 2]), 3)
    assert scores.tolist() == pytest.approx([0.9, 0.3, 0.2])


def test_logit_heads():
    assert logits_to_scores(np.array([[0.0], [2.0]])).tolist() == pytest.approx([0.5, 1 / (1 + np.exp(-2))])
    two = np.array([[1.0, 3.0]])
    softmax = np.exp(two) / np.exp(two).sum()
    assert logits_to_scores(two)[0] == pytest.approx(softmax[0, 1])
    assert logits_to_scores(np.array([[2.5]]), raw=True)[0] == 2.5


def test_cosine_head_maps_to_unit_interval():
    query = np.array([1.0, 0.0])
    scores = cosine_to_scores(query, np.array([[2.0, 0.0], [-1.0, 0.0], [0.0, 3.0]]))
    assert scores.tolist() == pytest.approx([1.0, 0.0, 0.5])


class KeywordEmbedder:
    """Fake embedding engine: a sequence's vector says whether token 7 (the 'relevant' word) is in it."""

    def shares_prefix(self, prefix_length, lengths):
        return False

    def __init__(self):
        self.calls = []

    async def run(self, token_ids, token_type_ids=None, rows=ALL_ROWS):
        self.calls.append([list(ids) for ids in token_ids])
        return np.array([[1.0, 0.0] if 7 in ids else [0.0, 1.0] for ids in token_ids], dtype=np.float32)


class PairCounter:
    """Fake cross-encoder: one logit = number of query tokens (type 0 content) found in the document part."""

    def shares_prefix(self, prefix_length, lengths):
        return False

    async def run(self, token_ids, token_type_ids=None, rows=ALL_ROWS):
        logits = []
        for ids, types in zip(token_ids, token_type_ids):
            query = {t for t, k in zip(ids, types) if k == 0 and t not in (CLS, SEP)}
            doc = [t for t, k in zip(ids, types) if k == 1 and t != SEP]
            assert len(ids) <= 16
            logits.append([float(sum(t in query for t in doc))])
        return np.array(logits, dtype=np.float32)


def test_embedding_rerank_finds_the_relevant_passage_at_the_end_of_a_long_document():
    engine = KeywordEmbedder()
    model = RerankModel(engine, window=10, single=SINGLE, pair=PAIR, cross_encoder=False)
    long_doc = [1] * 40 + [7]
    scores = asyncio.run(rerank_scores(model, [7], [[2, 3], long_doc, [4]], RerankOptions()))
    assert int(np.argmax(scores)) == 1 and scores[1] == pytest.approx(1.0)
    # every sequence sent fits the window with its specials
    assert max(len(ids) for ids in engine.calls[0]) <= 10


def test_every_chunk_of_a_long_document_starts_with_its_prompt():
    engine = KeywordEmbedder()
    model = RerankModel(
        engine, window=10, single=SINGLE, pair=PAIR, cross_encoder=False, document_lead=(5, 6)
    )
    asyncio.run(rerank_scores(model, [7], [[5, 6, *range(20, 40)]], RerankOptions()))
    chunks = engine.calls[0][1:]
    assert len(chunks) == 4 and all(ids[:3] == [CLS, 5, 6] and len(ids) <= 10 for ids in chunks)
    assert [token for ids in chunks for token in ids[3:-1]] == list(range(20, 40))


def test_cross_encoder_chunks_leave_room_for_the_query_and_specials():
    model = RerankModel(PairCounter(), window=16, single=SINGLE, pair=PAIR, cross_encoder=True)
    query = [7, 8, 9]
    docs = [[1] * 30 + [7, 8], [9], [5] * 3]
    scores = asyncio.run(rerank_scores(model, query, docs, RerankOptions(raw_scores=True)))
    assert scores.tolist() == [2.0, 1.0, 0.0]
    # max_chunks_per_doc drops the tail chunk where the match sits
    limited = asyncio.run(
        rerank_scores(model, query, docs, RerankOptions(max_chunks_per_doc=2, raw_scores=True))
    )
    assert limited.tolist() == [0.0, 1.0, 0.0]
    truncated = asyncio.run(
        rerank_scores(model, query, docs, RerankOptions(max_tokens_per_doc=10, raw_scores=True))
    )
    assert truncated[0] == 0.0


def test_query_leaving_no_room_and_too_many_chunks_are_errors():
    model = RerankModel(PairCounter(), window=16, single=SINGLE, pair=PAIR, cross_encoder=True)
    with pytest.raises(QueryTooLong):
        asyncio.run(rerank_scores(model, [1] * 13, [[2]], RerankOptions()))
    with pytest.raises(TooManyChunks):
        asyncio.run(rerank_scores(model, [1], [[2] * 12 * 10_001], RerankOptions()))


class TypesSeen:
    """Fake cross-encoder that keeps the types each call received and scores by length."""

    def shares_prefix(self, prefix_length, lengths):
        return False

    def __init__(self):
        self.types = []

    async def run(self, token_ids, token_type_ids=None, rows=ALL_ROWS):
        self.types.append(token_type_ids)
        return np.array([[float(len(ids))] for ids in token_ids], dtype=np.float32)


def test_pairs_without_types_reach_the_engine_as_none_and_bert_pairs_with_theirs():
    untyped = PairTemplate(Piece((CLS,), (0,)), Piece((SEP, SEP), (0, 0)), Piece((SEP,), (0,)), 0, 0)
    for template, expect_types in ((untyped, False), (PAIR, True)):
        engine = TypesSeen()
        model = RerankModel(engine, window=16, single=SINGLE, pair=template, cross_encoder=True)
        scores = asyncio.run(rerank_scores(model, [7, 8], [[1, 2, 3], [4]], RerankOptions(raw_scores=True)))
        specials = template.num_special_tokens
        assert scores.tolist() == [3.0 + 2 + specials, 1.0 + 2 + specials]  # the pairs' lengths
        (types,) = engine.types
        if expect_types:
            assert [t.tolist() for t in types] == [[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]]
        else:
            assert types is None


class PositionalScorer:
    """Fake causal scorer: a sequence's logit weighs each token by its position, so a pair split
    anywhere but at its true start scores differently; with `shares_prefixes`, each sequence continues
    `prefix` where the engine's rule says it pays."""

    def __init__(self, shares_prefixes):
        self.shares_prefixes = shares_prefixes
        self.prefixes = []

    def shares_prefix(self, prefix_length, lengths):
        return self.shares_prefixes and prefix_pays(prefix_length, lengths, min_saved_tokens=20)

    async def run(self, token_ids, token_type_ids=None, rows=ALL_ROWS):
        assert token_type_ids is None
        self.prefixes.append(rows.prefix)
        head = list(rows.prefix or ())
        return np.array([[float(sum(i * t for i, t in enumerate(head + list(ids))))] for ids in token_ids])


def test_a_causal_scorer_gets_the_template_head_and_query_once_and_scores_as_whole_pairs():
    judge = PairTemplate(Piece((CLS, 2), (0, 0)), Piece((3,), (0,)), Piece((SEP, 4), (0, 0)), 0, 0)
    query, docs = [7, 8, 9], [[1] * 30 + [7, 8], [9], [5, 6] * 3]
    options = RerankOptions(raw_scores=True)
    scores = {}
    for shares in (False, True):
        engine = PositionalScorer(shares)
        model = RerankModel(engine, window=16, single=SINGLE, pair=judge, cross_encoder=True)
        scores[shares] = asyncio.run(rerank_scores(model, query, docs, options))
        assert engine.prefixes == [[CLS, 2, 7, 8, 9, 3] if shares else None]
    assert scores[True].tolist() == scores[False].tolist()


def test_one_document_or_a_short_prefix_goes_as_whole_pairs():
    # the engine's rule: sharing must save its min_saved_tokens (the fake's 20) of the whole pairs' tokens
    judge = PairTemplate(Piece((CLS, 2), (0, 0)), Piece((3,), (0,)), Piece((SEP, 4), (0, 0)), 0, 0)
    options = RerankOptions(raw_scores=True)
    engine = PositionalScorer(True)
    model = RerankModel(engine, window=64, single=SINGLE, pair=judge, cross_encoder=True)
    asyncio.run(rerank_scores(model, [7, 8, 9], [[1] * 40], options))  # one document: nothing to save
    asyncio.run(rerank_scores(model, [7], [[1] * 50, [2] * 50], options))  # 4 tokens saved
    asyncio.run(rerank_scores(model, [7, 8, 9] * 3, [[1] * 30] * 3, options))  # 24
    assert engine.prefixes == [None, None, [CLS, 2, *[7, 8, 9] * 3, 3]]
