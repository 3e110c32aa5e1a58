"""Special-token templates read off a tokenizer (one text, [CLS] a [SEP], or a pair), and the prompts
that turn a query and its documents into texts: none, an embedding model's own, or an LLM judge's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer


@dataclass(frozen=True, slots=True)
class Piece:
    ids: tuple[int, ...] = ()
    type_ids: tuple[int, ...] = ()


def _pieces(tokenizer: Tokenizer, texts: tuple[str, ...]) -> tuple[list[Piece], list[int]]:
    """Split the specials of an encoding around its texts: [before, between..., after]."""
    encoding = tokenizer.encode(*texts, add_special_tokens=True)
    pieces = [Piece()]
    content_types: list[int] = []
    previous: int | None = None
    ids, types = [], []
    for token, type_id, sequence in zip(encoding.ids, encoding.type_ids, encoding.sequence_ids):
        if sequence is None:
            ids.append(token)
            types.append(type_id)
            continue
        if sequence != previous:
            pieces[-1] = Piece(tuple(ids), tuple(types))
            pieces.append(Piece())
            ids, types = [], []
            content_types.append(type_id)
            previous = sequence
    pieces[-1] = Piece(tuple(ids), tuple(types))
    return pieces, content_types


@dataclass(frozen=True, slots=True)
class SingleTemplate:
    prefix: Piece
    suffix: Piece

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> SingleTemplate:
        pieces, _ = _pieces(tokenizer, ("a",))
        return cls(pieces[0], pieces[1])

    @property
    def num_special_tokens(self) -> int:
        return len(self.prefix.ids) + len(self.suffix.ids)

    def apply(self, ids: Sequence[int]) -> list[int]:
        return [*self.prefix.ids, *ids, *self.suffix.ids]


@dataclass(frozen=True, slots=True)
class PairTemplate:
    prefix: Piece
    middle: Piece
    suffix: Piece
    first_type: int
    second_type: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> PairTemplate:
        pieces, content_types = _pieces(tokenizer, ("a", "b"))
        return cls(pieces[0], pieces[1], pieces[2], content_types[0], content_types[1])

    @property
    def num_special_tokens(self) -> int:
        return len(self.prefix.ids) + len(self.middle.ids) + len(self.suffix.ids)

    def apply(self, first: Sequence[int], second: Sequence[int]) -> tuple[list[int], list[int]]:
        """(token ids, token type ids) of the pair."""
        ids = [*self.prefix.ids, *first, *self.middle.ids, *second, *self.suffix.ids]
        type_ids = [
            *self.prefix.type_ids,
            *[self.first_type] * len(first),
            *self.middle.type_ids,
            *[self.second_type] * len(second),
            *self.suffix.type_ids,
        ]
        return ids, type_ids


@dataclass(frozen=True, slots=True)
class TextPrompts:
    """How a query and its documents become texts for a cross-encoder (no prompts) or an embedding
    model (its own query and document prompts). They have no instruction: it is ignored."""

    query: str = ""
    document: str = ""

    def query_text(self, query: str, instruction: str | None = None) -> str:
        return self.query + query

    def document_text(self, document: str) -> str:
        return self.document + document


@dataclass(frozen=True, slots=True)
class JudgePrompt:
    """An LLM reranker's chat prompt: the pair is one user turn, and the assistant's next token is
    the judgment "yes" or "no". The query text ends where the document begins, so the two tokenize
    apart as they would in one string (the space after "<Document>:" starts the first word)."""

    prefix: str
    suffix: str
    default_instruction: str

    def query_text(self, query: str, instruction: str | None = None) -> str:
        return f"<Instruct>: {instruction or self.default_instruction}\n<Query>: {query}\n<Document>:"

    def document_text(self, document: str) -> str:
        return " " + document

    def pair_template(self, tokenizer: Tokenizer) -> PairTemplate:
        """The chat turn's fixed tokens around (query text, document text), no token types."""
        prefix = tuple(tokenizer.encode(self.prefix, add_special_tokens=False).ids)
        suffix = tuple(tokenizer.encode(self.suffix, add_special_tokens=False).ids)
        return PairTemplate(
            Piece(prefix, (0,) * len(prefix)), Piece(), Piece(suffix, (0,) * len(suffix)), 0, 0
        )


# Qwen3-Reranker's prompt, as its model card gives it
QWEN3_JUDGE = JudgePrompt(
    prefix="<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n',
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    default_instruction="Given a web search query, retrieve relevant passages that answer the query",
)
JUDGE_PROMPTS = {"qwen3-judge": QWEN3_JUDGE}
