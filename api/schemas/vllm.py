"""Wire types of vLLM's score, pooling and classify APIs (/score, /pooling, /classify)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class ScoreRequest(msgspec.Struct, kw_only=True):
    """vLLM names the two sides text_1 / text_2, queries / documents (its newer name) or data_1 /
    data_2; a request gives one of the three."""

    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    data_1: str | list[str] | None = None
    data_2: str | list[str] | None = None
    model: str | None = None


class ScoreData(msgspec.Struct):
    index: int
    score: float
    object: str = "score"


class ScoreUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage
    object: str = "list"


class PoolingRequest(msgspec.Struct, kw_only=True):
    """vLLM's /pooling. `task`: "embed" (one vector a text), "token_embed" (a vector a token: ColBERT's,
    bge-m3's ColBERT vectors) or posy's "all" (bge-m3: dense_vecs, lexical_weights and colbert_vecs from
    one forward); None: the model's own (token_embed for ColBERT, else embed)."""

    input: str | list[str]
    model: str | None = None
    task: Literal["embed", "token_embed", "all"] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    truncate_prompt_tokens: int | None = None
    # posy's: "query" or "document" (the default) lays a ColBERT text out as one or the other; with
    # prompt_name, it picks an embedder's prompt as /v1/embeddings does
    input_type: str | None = None
    prompt_name: str | None = None


class PoolingData(msgspec.Struct):
    index: int
    # embed: [dim]; token_embed: [num_tokens][dim] (base64: the [num_tokens, dim] float32 matrix's bytes);
    # all: {"dense_vecs", "lexical_weights", "colbert_vecs"}
    data: Any
    object: str = "pooling"


class PoolingResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[PoolingData]
    usage: ScoreUsage
    object: str = "list"


class ClassifyRequest(msgspec.Struct, kw_only=True):
    """vLLM's /classify: one text (not a pair) a sequence classifier labels."""

    input: str | list[str]
    model: str | None = None
    truncate_prompt_tokens: int | None = None


class ClassifyData(msgspec.Struct):
    index: int
    label: str
    probs: list[float]
    num_classes: int
    object: str = "classify"


class ClassifyResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[ClassifyData]
    usage: ScoreUsage
    object: str = "list"
