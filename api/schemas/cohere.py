"""Wire types of Cohere's /v1/rerank and /v2/rerank, and of text-embeddings-inference's /rerank."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Document = str | dict[str, Any]


class RerankRequest(msgspec.Struct, kw_only=True):
    """Both Cohere versions: v1 adds max_chunks_per_doc, v2 adds max_tokens_per_doc."""

    query: Annotated[
        str | dict[str, Any],
        msgspec.Meta(
            description="the search query (not empty); for an image model also an image, as Jina's "
            '{"image": ...} or vLLM\'s {"content": [part]}',
            examples=["what do cats eat?"],
        ),
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
    query: Annotated[str, msgspec.Meta(description="the search query (not empty)")]
    texts: Annotated[list[str], msgspec.Meta(description="the documents, 1 to 1,000")]
    raw_scores: Annotated[
        bool,
        msgspec.Meta(
            description="the model's raw score (a logit, a cosine, a MaxSim sum) instead of one in [0, 1]"
        ),
    ] = False
    return_text: Annotated[bool, msgspec.Meta(description="each result carries its text")] = False
    truncate: Annotated[
        bool | None,
        msgspec.Meta(
            description="cut each text to one window instead of scoring its best chunk; none: --auto-truncate"
        ),
    ] = None
    truncation_direction: Annotated[str, msgspec.Meta(description="TEI's; posy keeps a text's start")] = (
        "Right"
    )
    instruction: Annotated[
        str | None, msgspec.Meta(description="posy's: the task instruction of rerankers that take one")
    ] = None


class TeiRank(msgspec.Struct, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class EmbedRequest(msgspec.Struct, kw_only=True):
    """Cohere's /v2/embed: texts, or (an image model's) images."""

    texts: Annotated[list[str] | None, msgspec.Meta(description="the texts, 1 to 2048")] = None
    model: Annotated[
        str | None,
        msgspec.Meta(
            description="a served model's name (GET /v1/models); none: the first that serves the task"
        ),
    ] = None
    input_type: Annotated[
        str | None,
        msgspec.Meta(
            description="search_query, search_document, classification or clustering: the model's prompt"
        ),
    ] = None
    embedding_types: Annotated[
        list[EmbeddingType] | None,
        msgspec.Meta(description="any of float, int8, uint8, binary, ubinary, base64; none: float"),
    ] = None
    truncate: Annotated[
        Literal["NONE", "START", "END"],
        msgspec.Meta(description="END or START cuts an over-long text at that end; NONE refuses it (400)"),
    ] = "END"
    output_dimension: Annotated[
        int | None, msgspec.Meta(description="keep the first N values and re-normalize")
    ] = None
    max_tokens: Annotated[
        int | None,
        msgspec.Meta(description="each text's token limit (at most the window); over it, truncate decides"),
    ] = None
    images: Annotated[
        list[str] | None,
        msgspec.Meta(
            description="instead of texts, for an image model: images as data URIs (input_type image)"
        ),
    ] = None
    inputs: Annotated[
        list[Any] | None,
        msgspec.Meta(
            description="instead of `texts`: each input's content one part, "
            '{"type": "text", "text": ...} or (an image model\'s) '
            '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}'
        ),
    ] = None


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
