"""Wire types of text-embeddings-inference's /embed, /tokenize and /info (its /rerank: schemas/cohere.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec


class TeiEmbedRequest(msgspec.Struct, kw_only=True):
    inputs: Annotated[str | list[str], msgspec.Meta(description="a text or a list of texts")]
    normalize: Annotated[
        bool,
        msgspec.Meta(
            description="unit vectors; false only for a model whose own pipeline does not normalize"
        ),
    ] = True
    truncate: Annotated[
        bool | None,
        msgspec.Meta(description="cut over-long texts instead of a 413/422; none: --auto-truncate"),
    ] = None
    truncation_direction: Annotated[
        Literal["Left", "Right"], msgspec.Meta(description="Right keeps a text's start, Left its end")
    ] = "Right"
    prompt_name: Annotated[str | None, msgspec.Meta(description="a prompt of the model's by name")] = None
    dimensions: Annotated[
        int | None, msgspec.Meta(description="keep the first N values (then re-normalized)")
    ] = None


class TeiTokenizeRequest(msgspec.Struct, kw_only=True):
    inputs: Annotated[str | list[str], msgspec.Meta(description="a text or a list of texts")]
    add_special_tokens: Annotated[
        bool, msgspec.Meta(description="with the model's special tokens ([CLS], [SEP], ...)")
    ] = True
    prompt_name: Annotated[
        str | None, msgspec.Meta(description="a prompt of the model's by name, tokenized before the text")
    ] = None


class TeiToken(msgspec.Struct):
    id: int
    text: str
    special: bool
    start: int | None  # character offsets in the input; None for a special token
    stop: int | None


class TeiInfo(msgspec.Struct):
    model_id: str
    model_dtype: str
    model_type: dict[str, Any]  # {"embedding": {"pooling": ...}} or {"reranker": {...}}
    max_input_length: int
    max_batch_tokens: int
    max_client_batch_size: int
    auto_truncate: bool
    version: str
    model_sha: str | None = None
    max_concurrent_requests: int | None = None
    max_batch_requests: int | None = None
    tokenization_workers: int | None = None
    sha: str | None = None
    docker_label: str | None = None


class TeiEmbedSparseRequest(msgspec.Struct, kw_only=True):
    inputs: Annotated[str | list[str], msgspec.Meta(description="a text or a list of texts")]
    truncate: Annotated[
        bool | None,
        msgspec.Meta(description="cut over-long texts instead of a 413/422; none: --auto-truncate"),
    ] = None
    truncation_direction: Annotated[
        Literal["Left", "Right"], msgspec.Meta(description="Right keeps a text's start, Left its end")
    ] = "Right"
    prompt_name: Annotated[str | None, msgspec.Meta(description="a prompt of the model's by name")] = None


class TeiSparseValue(msgspec.Struct):
    index: int  # a token id of the model's vocabulary
    value: float
