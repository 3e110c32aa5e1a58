"""rerank_scores: one score per document for a query, with a cross-encoder or an embedding model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from engine.interface import EngineInterface
from engine.outputs import ALL_ROWS, RowRequest
from scoring.chunking import max_over_chunks, split_into_chunks
from scoring.errors import QueryTooLong, TooManyChunks
from scoring.heads import cosine_to_scores, logits_to_scores, max_sim_to_scores
from scoring.late_interaction import LateInteraction
from scoring.templates import DOCUMENT_MARK, PairPrompt, PairTemplate, SingleTemplate, TextPrompts

MAX_CHUNKS_PER_REQUEST = 10_000


@dataclass(frozen=True, slots=True)
class RerankModel:
    engine: EngineInterface
    window: int
    single: SingleTemplate
    pair: PairTemplate
    # True: (query, chunk) pairs through a classifier or an LLM judge; False: cosine of separate embeddings
    cross_encoder: bool
    # how the query and documents become texts before tokenization
    prompts: TextPrompts | PairPrompt | LateInteraction = TextPrompts()
    # a ColBERT model: MaxSim of the query's token vectors against each chunk's
    late_interaction: LateInteraction | None = None
    rows: RowRequest = ALL_ROWS  # what its rerank asks of the engine's rows (bge-m3's: dense vectors)
    # the tokens of document_lead(prompts): a long document's every chunk starts with them
    document_lead: Sequence[int] = ()

    def texts(self, query: str, documents: Sequence[str], instruction: str | None) -> list[str]:
        """[query text, *document texts], to tokenize without special tokens."""
        return [self.prompts.query_text(query, instruction), *map(self.prompts.document_text, documents)]


def document_lead(prompts: TextPrompts | PairPrompt | LateInteraction) -> str:
    """The text a document's laid-out text starts with (an embedding model's document prompt, a judge's
    ">:"), less trailing whitespace; "" where none or only whitespace."""
    return prompts.document_text(DOCUMENT_MARK).split(DOCUMENT_MARK)[0].rstrip()


@dataclass(frozen=True, slots=True)
class RerankOptions:
    max_chunks_per_doc: int | None = None
    max_tokens_per_doc: int | None = None
    raw_scores: bool = False
    # for instruction-following rerankers (Qwen3-Reranker); None is the model's default; others ignore it
    instruction: str | None = None


async def rerank_scores(
    model: RerankModel, query_ids: Sequence[int], docs_ids: Sequence[Sequence[int]], options: RerankOptions
) -> np.ndarray:
    """Token ids without special tokens in, [num_docs] scores out (in [0, 1] unless raw)."""
    late = model.late_interaction
    if late is not None:  # a query is cut to the model's query length, never refused
        chunk_len = late.content_room(is_query=False)
    elif model.cross_encoder:
        chunk_len = model.window - len(query_ids) - model.pair.num_special_tokens
        if chunk_len < 1:
            raise QueryTooLong(len(query_ids) + model.pair.num_special_tokens, model.window)
    else:
        chunk_len = model.window - model.single.num_special_tokens
        if len(query_ids) > chunk_len:
            raise QueryTooLong(len(query_ids) + model.single.num_special_tokens, model.window)
    chunks: list[Sequence[int]] = []
    owners: list[int] = []
    for index, ids in enumerate(docs_ids):
        if options.max_tokens_per_doc is not None:  # a layout's closing tokens kept (LateInteraction.cut)
            limit = options.max_tokens_per_doc
            ids = ids[:limit] if late is None else late.cut(ids, limit)
        closing = () if late is None else late.closing_ids
        doc_chunks = split_into_chunks(
            ids, chunk_len, options.max_chunks_per_doc, model.document_lead, closing
        )
        chunks.extend(doc_chunks)
        owners.extend([index] * len(doc_chunks))
        if len(chunks) > MAX_CHUNKS_PER_REQUEST:
            raise TooManyChunks(len(chunks), MAX_CHUNKS_PER_REQUEST)
    pair = model.pair
    prefix_length = len(pair.prefix.ids) + len(query_ids) + len(pair.middle.ids)
    suffix_lengths = [len(chunk) + len(pair.suffix.ids) for chunk in chunks]
    # a pair that starts with the query may share it (not one whose document comes first)
    untyped_pairs = model.cross_encoder and not pair.has_types and not pair.document_first
    if untyped_pairs and model.engine.shares_prefix(prefix_length, suffix_lengths):
        # a causal scorer: every pair starts with the template's head, the query and the template's
        # middle, which the engine runs once a batch; each chunk and the template's tail continue it
        prefix = [*pair.prefix.ids, *query_ids, *pair.middle.ids]
        suffixes = [[*chunk, *pair.suffix.ids] for chunk in chunks]
        logits = await model.engine.run(suffixes, None, replace(model.rows, prefix=prefix))
        chunk_scores = logits_to_scores(logits, raw=options.raw_scores)
    elif model.cross_encoder:
        pairs = [model.pair.apply(query_ids, chunk) for chunk in chunks]
        # all-zero types (RoBERTa's pairs, a judge's) go as none: the engine packs zeros for them
        types = [types for _, types in pairs] if model.pair.has_types else None
        logits = await model.engine.run([ids for ids, _ in pairs], types, model.rows)
        chunk_scores = logits_to_scores(logits, raw=options.raw_scores)
    elif late is not None:
        # the query runs once a batch, on its own; each chunk's row is its MaxSim against it, computed on
        # the device (TokenEmbedder.max_sim)
        query = late.query_ids(query_ids)
        documents = [late.document_ids(chunk) for chunk in chunks]
        rows = await model.engine.run(documents, None, replace(model.rows, prefix=query))
        chunk_scores = max_sim_to_scores(rows[:, 0], len(query), raw=options.raw_scores)
    else:
        sequences = [model.single.apply(query_ids), *(model.single.apply(chunk) for chunk in chunks)]
        vectors = await model.engine.run(sequences, None, model.rows)
        chunk_scores = cosine_to_scores(vectors[0], vectors[1:], raw=options.raw_scores)
    return max_over_chunks(chunk_scores, np.asarray(owners), len(docs_ids))
