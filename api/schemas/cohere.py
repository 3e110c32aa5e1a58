"""Wire types of Cohere's /v1/rerank and /v2/rerank, and of text-embeddings-inference's /rerank."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Document = str | dict[str, Any]


class RerankRequest(msgspec.Struct, kw_only=True):
    """Both Cohere versions: v1 adds max_chunks_per_doc, v2 adds max_tokens_per_doc."""

    query: str
    documents: list[Document]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    rank_fields: list[str] | None = None
    max_chunks_per_doc: int | None = None
    max_tokens_per_doc: int | None = None
    # posy's extension for instruction-following rerankers (Qwen3-Reranker); ignored by others
    instruction: str | None = None


class RerankResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float
    # absent (never null) unless return_documents was asked for: {"text": ...} for a string document,
    # a v1 object document whole (one dict type: msgspec's schemas allow one dict-like type a union)
    document: dict[str, Any] | None = None


class ApiVersion(msgspec.Struct):
    version: str


class BilledUnits(msgspec.Struct):
    search_units: int


class RerankMeta(msgspec.Struct):
    api_version: ApiVersion
    billed_units: BilledUnits


class RerankResponse(msgspec.Struct):
    id: str
    results: list[RerankResult]
    meta: RerankMeta


class TeiRerankRequest(msgspec.Struct, kw_only=True):
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: str = "Right"
    instruction: str | None = None  # as in Cohere's routes


class TeiRank(msgspec.Struct, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class EmbedRequest(msgspec.Struct, kw_only=True):
    """Cohere's /v2/embed, texts only."""

    texts: list[str] | None = None
    model: str | None = None
    input_type: str | None = None
    embedding_types: list[EmbeddingType] | None = None  # None: ["float"]
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: int | None = None
    max_tokens: int | None = None
    images: list[str] | None = None
    inputs: list[Any] | None = None


class EmbeddingsByType(msgspec.Struct, omit_defaults=True, rename={"float_": "float"}):
    float_: list[list[float]] | None = None
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[bytes] | None = None  # base64 strings on the wire


class EmbedBilledUnits(msgspec.Struct):
    input_tokens: int


class EmbedMeta(msgspec.Struct):
    api_version: ApiVersion
    billed_units: EmbedBilledUnits


class EmbedResponse(msgspec.Struct):
    id: str
    embeddings: EmbeddingsByType
    texts: list[str]
    meta: EmbedMeta
    response_type: str = "embeddings_by_type"
