"""Listwise rerank (jina-reranker-v3): the query and many documents in one prompt, where the documents
attend to each other; each document ends in a marker token and so does the query, after them, and a
document's score is the cosine of its marker's vector and the query's (engine/models/listwise.py).
Documents that do not fit one prompt go to more prompts, each with the query."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.interface import EngineInterface
from scoring.errors import QueryTooLong
from scoring.heads import cosine_to_scores
from scoring.rerank import RerankOptions

# the model's own limits on its inputs: a longer query or document is cut to these tokens (v2's
# max_tokens_per_doc cuts documents shorter where it asks)
MAX_QUERY_TOKENS = 512
MAX_DOCUMENT_TOKENS = 2048
# documents a prompt holds at most; more go to further prompts, each with the query
MAX_DOCUMENTS_PER_PROMPT = 125
SYSTEM = (
    "You are a search relevance expert who can determine a ranking of the passages based on how relevant "
    "they are to the query. If the query is a question, how relevant a passage is depends on how well it "
    "answers the question. If not, try to analyze the intent of the query and assess how well each passage "
    "satisfies the intent. If an instruction is provided, you should follow the instruction when "
    "determining the ranking."
)


@dataclass(frozen=True, slots=True)
class ListwisePrompt:
    """jina-reranker-v3's prompt: a chat turn listing the passages, each closed by the document marker,
    then the query closed by the query marker, and an empty thinking block."""

    document_marker: str = "<|embed_token|>"
    query_marker: str = "<|rerank_token|>"

    def sanitized(self, text: str) -> str:
        """The text without marker strings (removed until none is left: removing one may join another)."""
        while True:
            before = text
            for marker in (self.document_marker, self.query_marker):
                text = text.replace(marker, "")
            if text == before:
                return text

    def text(self, query: str, documents: Sequence[str], instruction: str | None = None) -> str:
        """The prompt of sanitized texts."""
        lines = (
            f"I will provide you with {len(documents)} passages, each indicated by a numerical identifier. "
            f"Rank the passages based on their relevance to query: {query}\n"
        )
        if instruction:
            lines += f"<instruct>\n{instruction}\n</instruct>\n"
        passages = (
            f'<passage id="{index}">\n{document}{self.document_marker}\n</passage>'
            for index, document in enumerate(documents)
        )
        lines += "\n".join(passages) + "\n" + f"<query>\n{query}{self.query_marker}\n</query>"
        return (
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{lines}<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )


@dataclass(frozen=True, slots=True)
class ListwiseModel:
    engine: EngineInterface
    prompt: ListwisePrompt
    max_prompt_tokens: int  # the longest prompt the model (and the engine's batch) takes
    passage_tokens: int  # a passage's tokens besides its text's, at most (passage_tokens())
    # texts -> their token ids, without special tokens added (markers in a text are tokens of it)
    tokenize: Callable[[Sequence[str]], Awaitable[list[list[int]]]]
    decode: Callable[[Sequence[int]], str]  # ids -> text, for a text cut to a number of tokens


async def listwise_scores(
    model: ListwiseModel, query: str, documents: Sequence[str], options: RerankOptions
) -> np.ndarray:
    """[num_docs] scores: (1 + cosine) / 2, or the cosine where raw."""
    prompt = model.prompt
    instruction = prompt.sanitized(options.instruction) if options.instruction else None
    texts = [prompt.sanitized(query), *map(prompt.sanitized, documents)]
    ids = await model.tokenize(texts)
    query_ids, docs_ids = ids[0][:MAX_QUERY_TOKENS], ids[1:]
    query = model.decode(query_ids) if len(query_ids) < len(ids[0]) else texts[0]
    # what a prompt holds besides its passages
    fixed = len((await model.tokenize([prompt.text(query, [], instruction)]))[0])
    room = model.max_prompt_tokens - fixed - model.passage_tokens
    if room < 1:
        raise QueryTooLong(fixed + model.passage_tokens, model.max_prompt_tokens)
    limit = min(room, options.max_tokens_per_doc or MAX_DOCUMENT_TOKENS, MAX_DOCUMENT_TOKENS)
    kept = [model.decode(doc[:limit]) if len(doc) > limit else text for doc, text in zip(docs_ids, texts[1:])]
    sizes = [min(len(doc), limit) + model.passage_tokens for doc in docs_ids]
    blocks = _blocks(sizes, model.max_prompt_tokens - fixed)
    prompts = await model.tokenize(
        [prompt.text(query, kept[start:end], instruction) for start, end in blocks]
    )
    # a block whose text came out longer than its estimate (tokens merging across a text's edges) is split
    while (
        over := next((i for i, p in enumerate(prompts) if len(p) > model.max_prompt_tokens), None)
    ) is not None:
        start, end = blocks[over]
        if end - start == 1:
            raise QueryTooLong(len(prompts[over]), model.max_prompt_tokens)
        middle = (start + end) // 2
        blocks[over : over + 1] = [(start, middle), (middle, end)]
        prompts[over : over + 1] = await model.tokenize(
            [prompt.text(query, kept[a:b], instruction) for a, b in blocks[over : over + 2]]
        )
    rows = await model.engine.run(prompts)
    scores, at = np.empty(len(documents)), 0
    for start, end in blocks:  # each prompt's rows: its documents' in order, then its query's
        count = end - start
        scores[start:end] = cosine_to_scores(rows[at + count], rows[at : at + count], raw=options.raw_scores)
        at += count + 1
    return scores


def passage_tokens(prompt: ListwisePrompt, count: Callable[[str], int]) -> int:
    """A passage's tokens besides its text's, at most: those of 1,000 one-letter passages (3-digit ids)
    over 1,000, rounded up, with one to spare for a text whose edges merge with the wrapper's."""
    many = count(prompt.text("", ["x"] * 1000)) - count(prompt.text("", []))
    return -(-many // 1000) + 1


def _blocks(sizes: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive documents grouped while their tokens stay within `budget` and their count within
    MAX_DOCUMENTS_PER_PROMPT: (start, end) of each group."""
    blocks, start, used = [], 0, 0
    for index, size in enumerate(sizes):
        if index > start and (used + size > budget or index - start == MAX_DOCUMENTS_PER_PROMPT):
            blocks.append((start, index))
            start, used = index, 0
        used += size
    blocks.append((start, len(sizes)))
    return blocks
