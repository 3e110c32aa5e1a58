"""Late interaction (ColBERT, ColQwen2): how a query's and a document's tokens are laid out (a marker after
the first special token, cut to the model's lengths, a query expanded with its mask token; or a text layout
around them, as ColQwen2's processor writes it, an image document's too, a cut keeping its closing
tokens), which of a document's token vectors count (its punctuation's do not), and MaxSim: each query
vector's best match among a document's, summed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.checkpoint.colbert import ColbertConfig
from scoring.templates import Piece, SingleTemplate

# the input types (a request's input_type, posy embed's --input-type) that lay texts out as queries
QUERY_INPUT_TYPES = ("query", "search_query")
NO_TEMPLATE = SingleTemplate(Piece((), ()), Piece((), ()))


@dataclass(frozen=True, slots=True)
class LateInteraction:
    config: ColbertConfig
    single: SingleTemplate
    # the tokens a processor's text layout closes a text with (ColQwen2's and ColPali's ten pads and a
    # newline): a text cut to a length keeps them
    closing_ids: tuple[int, ...] = ()

    @classmethod
    def build(
        cls,
        config: ColbertConfig,
        single: SingleTemplate,
        content_ids: Callable[[Sequence[str]], list[list[int]]],
    ) -> LateInteraction:
        """The model's late interaction, its layout's closing tokens read with its tokenizer's
        `content_ids`."""
        layout = config.text_layout
        return cls(config, single, () if layout is None else tuple(content_ids([layout.query_suffix])[0]))

    @property
    def template(self) -> SingleTemplate:
        """The special tokens around a query's or a document's tokens: the tokenizer's, or none where a
        processor's text layout writes them itself (ColPali's <bos>)."""
        return NO_TEMPLATE if self.config.text_layout is not None else self.single

    # the prompts protocol of scoring/templates: a query's and a document's text before tokenization (a
    # processor's layout of either: ColQwen2's lays documents out as queries)
    def query_text(self, query: str, instruction: str | None = None) -> str:
        layout = self.config.text_layout
        return query if layout is None else layout.query_prefix + query + layout.query_suffix

    def document_text(self, document: str) -> str:
        return self.query_text(document)

    def laid_out_text(self, text: str, is_query: bool) -> str:
        """A text as a query's or a document's, before tokenization."""
        return self.query_text(text) if is_query else self.document_text(text)

    def image_texts(self) -> list[str] | None:
        """The texts before and after an image document's vision tokens; None: the model takes no image."""
        layout = self.config.text_layout
        return None if layout is None else [layout.image_before, layout.image_after]

    def query_ids(self, content: Sequence[int]) -> list[int]:
        """A query's tokens: cut to query_length, then expanded to it (where the model expands)."""
        config = self.config
        ids = self._laid_out(content, config.query_length, config.query_prefix_id)
        if config.expansion_token_id is not None:
            ids += [config.expansion_token_id] * (config.query_length - len(ids))
        return ids

    def document_ids(self, content: Sequence[int]) -> list[int]:
        config = self.config
        return self._laid_out(content, config.document_length, config.document_prefix_id)

    def content_room(self, is_query: bool) -> int:
        """Content tokens that fit a query or a document beside its special tokens and marker."""
        config = self.config
        length, marker = (
            (config.query_length, config.query_prefix_id)
            if is_query
            else (config.document_length, config.document_prefix_id)
        )
        return length - self.template.num_special_tokens - (marker is not None)

    def cut(self, ids: Sequence[int], limit: int) -> list[int]:
        """A laid-out text's `ids` cut to `limit` tokens, its layout's closing tokens kept at the end."""
        if len(ids) <= limit:
            return list(ids)
        closing = self.closing_ids
        if closing and limit > len(closing) and tuple(ids[-len(closing) :]) == closing:
            return [*ids[: limit - len(closing)], *closing]
        return list(ids[:limit])

    def _laid_out(self, content: Sequence[int], length: int, marker: int | None) -> list[int]:
        room = length - self.template.num_special_tokens - (marker is not None)
        ids = self.template.apply(self.cut(content, room))
        if marker is not None:
            ids.insert(1, marker)  # after [CLS], as PyLate and colbert-ai place it
        return ids

    def kept(self, ids: Sequence[int], vectors: np.ndarray, is_query: bool) -> np.ndarray:
        """The token vectors that count (kept_tokens)."""
        if is_query or not self.config.skiplist_ids:
            return vectors
        return vectors[kept_tokens(self.config, np.asarray(ids), is_query)]


def kept_tokens(config: ColbertConfig, ids: np.ndarray, is_query: bool) -> np.ndarray:
    """Which tokens' vectors count (a bool a token id, of one text or several end to end): all of a
    query's (its expansion too), a document's but those of its skiplist tokens."""
    if is_query or not config.skiplist_ids:
        return np.ones(len(ids), dtype=bool)
    return ~np.isin(ids, list(config.skiplist_ids))


def split_rows(rows: np.ndarray, lengths: Sequence[int]) -> list[np.ndarray]:
    """A token head's rows of several sequences -> each sequence's rows (views)."""
    return np.split(rows, np.cumsum(lengths)[:-1])


def max_sim(query: np.ndarray, documents: Sequence[np.ndarray]) -> np.ndarray:
    """[num_query_tokens, dim] and each document's [n_i, dim] -> [num_docs] sums over the query's vectors
    of their best dot product with the document's (0 for a document with no vector)."""
    if not documents:
        return np.zeros(0)
    lengths = np.array([len(document) for document in documents])
    similarity = np.concatenate(documents).astype(np.float32) @ query.astype(np.float32).T  # [tokens, q]
    scores = np.zeros(len(documents))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    nonempty = lengths > 0
    if nonempty.any():
        best = np.maximum.reduceat(similarity, starts[nonempty], axis=0)  # [docs with vectors, q]
        scores[nonempty] = best.sum(axis=1, dtype=np.float64)
    return scores
