"""Wire types of text-embeddings-inference's /embed, /tokenize and /info (its /rerank: schemas/cohere.py)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class TeiEmbedRequest(msgspec.Struct, kw_only=True):
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool | None = None  # None: the server's --auto-truncate
    truncation_direction: Literal["Left", "Right"] = "Right"
    prompt_name: str | None = None
    dimensions: int | None = None


class TeiTokenizeRequest(msgspec.Struct, kw_only=True):
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


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
    inputs: str | list[str]
    truncate: bool | None = None  # None: the server's --auto-truncate
    truncation_direction: Literal["Left", "Right"] = "Right"
    prompt_name: str | None = None


class TeiSparseValue(msgspec.Struct):
    index: int  # a token id of the model's vocabulary
    value: float
