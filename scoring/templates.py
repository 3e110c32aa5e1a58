"""Special-token templates read off a tokenizer (one text, [CLS] a [SEP], or a pair), and the prompts
that turn a query and its documents into texts: none, an embedding model's own, or an LLM judge's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from scoring.errors import TemplateError

CONTENT_MARK = "\ue000"  # a private-use character: where a rendered template puts the content


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

    @classmethod
    def from_chat(
        cls, source: str, variables: dict[str, Any], tokenizer: Tokenizer, end: str, system: str | None = None
    ) -> SingleTemplate:
        """A vision-language embedder's layout of one input (gme-Qwen2-VL's): a user turn of it in the
        chat template after a system turn of `system` (None: the template's default), the assistant's
        prompt, then `end`."""
        from scoring.chat_template import render

        variables = {**variables, "add_generation_prompt": True}
        messages = [{"role": "user", "content": [{"type": "text", "text": CONTENT_MARK}]}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
        text = render(source, variables, messages, "an input")
        if text.count(CONTENT_MARK) != 1:
            raise TemplateError("the chat template does not lay out a user turn's text once")
        before, after = text.split(CONTENT_MARK)
        pieces = (tokenizer.encode(part, add_special_tokens=False).ids for part in (before, after + end))
        return cls(*(Piece(tuple(ids), (0,) * len(ids)) for ids in pieces))

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
    # the second text (a document) is laid out before the first (its query): jina-reranker-m0's pairs
    document_first: bool = False

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> PairTemplate:
        pieces, content_types = _pieces(tokenizer, ("a", "b"))
        return cls(pieces[0], pieces[1], pieces[2], content_types[0], content_types[1])

    @property
    def num_special_tokens(self) -> int:
        return len(self.prefix.ids) + len(self.middle.ids) + len(self.suffix.ids)

    @property
    def has_types(self) -> bool:
        """Some token of a pair has a type id other than 0 (a BERT pair; not RoBERTa's, nor a judge's)."""
        pieces = (self.prefix, self.middle, self.suffix)
        return bool(self.first_type or self.second_type or any(any(piece.type_ids) for piece in pieces))

    def apply(self, first: Sequence[int], second: Sequence[int]) -> tuple[list[int], np.ndarray]:
        """(token ids, token type ids) of the pair; the types as an int64 array, which packing copies at
        once (a list of 512 ints took 16 us to convert, the whole array's making 2)."""
        (first, first_type), (second, second_type) = (first, self.first_type), (second, self.second_type)
        if self.document_first:
            (first, first_type), (second, second_type) = (second, second_type), (first, first_type)
        ids = [*self.prefix.ids, *first, *self.middle.ids, *second, *self.suffix.ids]
        type_ids = np.empty(len(ids), dtype=np.int64)
        start = 0
        for part, value in (
            (self.prefix.type_ids, None),
            (first, first_type),
            (self.middle.type_ids, None),
            (second, second_type),
            (self.suffix.type_ids, None),
        ):
            end = start + len(part)
            type_ids[start:end] = part if value is None else value
            start = end
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
    the judgment "yes" or "no". The query text ends where the document's begins at a seam that the
    tokenizer's pre-tokenizer cuts anyway, so the two tokenize apart as they would in one string:
    Qwen3-Reranker's document starts with a space, which starts its first word; Qwen3-VL-Reranker's
    ("<Document>:{document}", no space) with the ">:" that would otherwise join a leading "(" of it."""

    prefix: str
    suffix: str
    default_instruction: str
    query_format: str = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>:"
    document_format: str = " {document}"

    def query_text(self, query: str, instruction: str | None = None) -> str:
        return self.query_format.format(instruction=instruction or self.default_instruction, query=query)

    def document_text(self, document: str) -> str:
        return self.document_format.format(document=document)

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
# Qwen3-VL-Reranker's, as its chat template and its reranker's format_mm_instruction lay a pair out: no
# think block, and each part's image (an image's vision tokens) right after its "<Query>:" or "<Document>:"
QWEN3_VL_JUDGE = JudgePrompt(
    prefix=QWEN3_JUDGE.prefix,
    suffix="<|im_end|>\n<|im_start|>assistant\n",
    default_instruction="Given a search query, retrieve relevant candidates that answer the query.",
    query_format="<Instruct>: {instruction}<Query>:{query}\n<Document",
    document_format=">:{document}",
)


@dataclass(frozen=True, slots=True)
class DocumentFirstPrompt:
    """A ranker that reads the document, then the query, in fixed texts, and scores the token after them
    (jina-reranker-m0: "**Document**:\\n{document}\\n**Query**:\\n{query}", then its score token). Each text
    is tokenized apart, as in one string: the fixed texts end in a newline, and the query starts on one."""

    before_document: str
    before_query: str
    score_token: int

    def query_text(self, query: str, instruction: str | None = None) -> str:
        return query

    def document_text(self, document: str) -> str:
        return document

    def pair_template(self, tokenizer: Tokenizer) -> PairTemplate:
        before_document, before_query = (
            tuple(tokenizer.encode(text, add_special_tokens=False).ids)
            for text in (self.before_document, self.before_query)
        )
        return PairTemplate(
            Piece(before_document, (0,) * len(before_document)),
            Piece(before_query, (0,) * len(before_query)),
            Piece((self.score_token,), (0,)),
            0,
            0,
            document_first=True,
        )


# jina-reranker-m0's layout, as its modeling code builds it (the score token appended after padding)
JINA_M0 = DocumentFirstPrompt("**Document**:\n", "\n**Query**:\n", score_token=100)
JUDGE_PROMPTS = {"qwen3-judge": QWEN3_JUDGE, "qwen3-vl-judge": QWEN3_VL_JUDGE, "jina-m0": JINA_M0}
QUERY_MARK, DOCUMENT_MARK = "\x00posy-query\x00", "\x00posy-document\x00"
IMAGE_MARK = "\x00posy-image\x00"  # where an image's tokens go in the texts a prompt makes of it


@dataclass(frozen=True, slots=True)
class ChatPairPrompt:
    """A sentence-transformers CrossEncoder's pair laid out by the model's chat template: the template's
    text before the query, between query and document, and after the document. The last word the
    tokenizer's pre-tokenizer cuts from a piece is handed to the text after it, so that the pieces
    tokenize apart as the whole rendered text does (byte-level BPE joins ": word" or ">:word" across
    the seam). There is no instruction."""

    prefix: str
    middle: str
    suffix: str
    query_lead: str = ""
    document_lead: str = ""

    @classmethod
    def from_template(cls, source: str, variables: dict, tokenizer: Tokenizer) -> ChatPairPrompt:
        from scoring.chat_template import render_pair

        text = render_pair(source, variables, QUERY_MARK, DOCUMENT_MARK)
        if text.count(QUERY_MARK) != 1 or text.count(DOCUMENT_MARK) != 1:
            raise TemplateError("the chat template does not render the query and the document once each")
        prefix, rest = text.split(QUERY_MARK)
        if DOCUMENT_MARK not in rest:
            raise TemplateError("the chat template renders the document before the query")
        middle, suffix = rest.split(DOCUMENT_MARK)
        prefix, query_lead = _hand_on(prefix, tokenizer)
        middle, document_lead = _hand_on(middle, tokenizer)
        return cls(prefix, middle, suffix, query_lead, document_lead)

    def query_text(self, query: str, instruction: str | None = None) -> str:
        return self.query_lead + query

    def document_text(self, document: str) -> str:
        return self.document_lead + document

    def pair_template(self, tokenizer: Tokenizer) -> PairTemplate:
        """The template's fixed tokens around (query text, document text), no token types."""
        prefix, middle, suffix = (
            tuple(tokenizer.encode(text, add_special_tokens=False).ids)
            for text in (self.prefix, self.middle, self.suffix)
        )
        return PairTemplate(
            Piece(prefix, (0,) * len(prefix)), Piece(middle, (0,) * len(middle)),
            Piece(suffix, (0,) * len(suffix)), 0, 0,
        )  # fmt: skip


def _hand_on(piece: str, tokenizer: Tokenizer) -> tuple[str, str]:
    """(piece, its last pre-token), the pre-token left empty after a special token or a newline."""
    special = [token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special]
    if not piece or piece.endswith(("\n", *special)) or tokenizer.pre_tokenizer is None:
        return piece, ""
    starts = [start for _, (start, _) in tokenizer.pre_tokenizer.pre_tokenize_str(piece)]
    last = max([*starts, *(piece.rfind(token) + len(token) for token in special if token in piece)])
    return piece[:last], piece[last:]


PairPrompt = JudgePrompt | ChatPairPrompt | DocumentFirstPrompt


def pair_prompt(pair_format: str, tokenizer: Tokenizer, chat_template: Any = None) -> PairPrompt | None:
    """The prompt a model's pairs are laid out by: a judge's, its chat template's (`chat_template`: an
    engine.checkpoint.cross_encoder.ChatTemplate), or None for the tokenizer's own pair template."""
    if pair_format in JUDGE_PROMPTS:
        return JUDGE_PROMPTS[pair_format]
    if pair_format == "chat-template":
        return ChatPairPrompt.from_template(chat_template.source, chat_template.variables, tokenizer)
    return None
