"""Normalizes OpenAI's `input` union into texts or token-id lists, checked item by item; the rules every
route's texts and queries follow (no empty text, no query of whitespace only)."""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import InvalidInput
from api.image_inputs import Item, content_item
from api.schemas.openai import EmbeddingInput


@dataclass(frozen=True, slots=True)
class Inputs:
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    parts: list[Item] | None = None  # texts and images, where some input is a content part

    def __len__(self) -> int:
        return len(next(given for given in (self.texts, self.token_ids, self.parts, []) if given is not None))


def normalize_input(value: EmbeddingInput, max_inputs: int) -> Inputs:
    if isinstance(value, str):
        items: list = [value]
    else:
        items = value
    if not items:
        raise InvalidInput("input must not be empty", "input")
    kinds = {type(item) for item in items}
    if dict in kinds and kinds <= {str, dict}:
        inputs = Inputs(
            parts=[
                item if isinstance(item, str) else content_item(item, f"input[{index}]")
                for index, item in enumerate(items)
            ]
        )
        for index, item in enumerate(inputs.parts):
            if not item:
                raise InvalidInput(f"input {index} is an empty string", "input")
    elif kinds == {str}:
        inputs = Inputs(texts=items)
        for index, text in enumerate(items):
            if not text:
                raise InvalidInput(f"input {index} is an empty string", "input")
    elif kinds == {int}:
        inputs = Inputs(token_ids=[items])
    elif kinds == {list}:
        inputs = Inputs(token_ids=items)
    else:
        raise InvalidInput(
            "input must be a string, a list of strings (and content parts), a list of token ids or a list of "
            "token-id lists, not a mix",
            "input",
        )
    if len(inputs) > max_inputs:
        raise InvalidInput(f"input has {len(inputs)} items, more than the limit of {max_inputs}", "input")
    return inputs


def check_texts(texts: list[str], max_inputs: int, param: str) -> None:
    """A list of texts (Cohere's and TEI's inputs): none empty, at most `max_inputs`."""
    if len(texts) > max_inputs:
        raise InvalidInput(f"{param} has {len(texts)} items, more than the limit of {max_inputs}", param)
    for index, text in enumerate(texts):
        if not text:
            raise InvalidInput(f"{param}[{index}] is an empty string", param)


def check_query(query: str, param: str = "query", index: int | None = None) -> None:
    """A query (rerank's, a score's first text; `index`: its place in a list) has more than whitespace."""
    if not query.strip():
        where = param if index is None else f"{param}[{index}]"
        raise InvalidInput(f"{where} must not be empty or only whitespace", param)
