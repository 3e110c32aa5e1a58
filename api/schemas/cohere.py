"""Wire types of Cohere's /v1/rerank and /v2/rerank, and of text-embeddings-inference's /rerank."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Document = str | dict[str, Any]


class RerankRequest(msgspec.Struct, kw_only=True):
    """Both Cohere versions: v1 adds max_chunks_per_doc, v2 adds max_tokens_per_doc."""

    query: Annotated[
        str, msgspec.Meta(description="the search query (not empty)", examples=["what do cats eat?"])
    ]
    documents: Annotated[
        list[Document],
        msgspec.Meta(
            description="1 to 1000 documents: strings, or (v1) objects with `text` or the `rank_fields`",
            examples=[["Cats eat fish.", "Trains run on rails."]],
        ),
    ]
    model: Annotated[str | None, msgspec.Meta(description="a served model's name (GET /v1/models)")] = None
    top_n: Annotated[
        int | None, msgspec.Meta(description="return this many results", extra_json_schema={"minimum": 1})
    ] = None
    return_documents: Annotated[bool, msgspec.Meta(description="each result carries its document")] = False
    rank_fields: Annotated[
        list[str] | None, msgspec.Meta(description="v1: the object fields ranked on, as 'field: value' lines")
    ] = None
    max_chunks_per_doc: Annotated[
        int | None,
        msgspec.Meta(
            description="v1: chunks of a long document scored (default 10)", extra_json_schema={"minimum": 1}
        ),
    ] = None
    max_tokens_per_doc: Annotated[
        int | None,
        msgspec.Meta(
            description="v2: a document's tokens read (default 4096)", extra_json_schema={"minimum": 1}
        ),
    ] = None
    # posy's extension for instruction-following rerankers (Qwen3-Reranker); ignored by others
    instruction: Annotated[
        str | None, msgspec.Meta(description="posy's: the task instruction of rerankers that take one")
    ] = None


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
