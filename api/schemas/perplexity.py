"""Wire types of Perplexity's Embeddings API: its usage cost (beside OpenAI's /v1/embeddings) and
/v1/contextualizedembeddings, whose body is Perplexity's (`input`) or Voyage's contextualized_embed one
(`inputs`); each field named as its API spells it."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

PERPLEXITY_LIMITS = "1 to 512 documents, 16,000 chunks in all, 120,000 tokens in all"
VOYAGE_LIMITS = "1 to 1,000 documents, 16,000 chunks in all, 120,000 tokens in all"


class Cost(msgspec.Struct):
    """A self-hosted model costs nothing."""

    input_cost: float = 0.0
    total_cost: float = 0.0
    currency: str = "USD"


class ContextualizedEmbeddingRequest(msgspec.Struct, kw_only=True):
    input: Annotated[
        list[list[str]] | None,
        msgspec.Meta(
            description="Perplexity's: documents, each the list of its chunks in order, none empty, a "
            f"document read in one pass of the model's window ({PERPLEXITY_LIMITS}); one chunk a document "
            "for a query",
            examples=[[["Berlin is the capital of Germany.", "The city has 3.8 million inhabitants."]]],
        ),
    ] = None
    inputs: Annotated[
        list[list[str]] | None,
        msgspec.Meta(description=f"Voyage's: documents as `input` has them ({VOYAGE_LIMITS})"),
    ] = None
    model: Annotated[str | None, msgspec.Meta(description="a served model's name (GET /v1/models)")] = None
    dimensions: Annotated[
        int | None,
        msgspec.Meta(
            description="Perplexity's: keep the first N values (Matryoshka), re-normalized where the model's "
            "vectors are",
            extra_json_schema={"minimum": 1},
        ),
    ] = None
    encoding_format: Annotated[
        Literal["base64_int8", "base64_binary", "base64"] | None,
        msgspec.Meta(
            description="Perplexity's base64_int8 (the default: the model's own int8, else round(127 x / "
            "max|x|)) or base64_binary (1 where x >= 0, least significant bit first); Voyage's base64 (each "
            "vector's little-endian numpy bytes) or none (JSON numbers)"
        ),
    ] = None
    input_type: Annotated[
        Literal["query", "document"] | None,
        msgspec.Meta(description="Voyage's: each document read after Voyage's query or document prompt"),
    ] = None
    output_dimension: Annotated[
        int | None,
        msgspec.Meta(description="Voyage's: as `dimensions`", extra_json_schema={"minimum": 1}),
    ] = None
    output_dtype: Annotated[
        Literal["float", "int8", "uint8", "binary", "ubinary"] | None,
        msgspec.Meta(
            description="Voyage's: float (the default); int8 (the model's own, else round(127 x / max|x|)), "
            "uint8 (int8 + 128); ubinary (1 where x > 0, most significant bit first), binary (ubinary - 128)"
        ),
    ] = None


class EmbeddingObject(msgspec.Struct):
    index: int
    embedding: list[float] | bytes  # int8 codes as numbers too; bytes: base64 on the wire
    object: str = "embedding"


class DocumentEmbeddings(msgspec.Struct):
    index: int  # the document's
    data: list[EmbeddingObject]  # its chunks', in order
    object: str = "list"


class ContextualizedUsage(msgspec.Struct, omit_defaults=True):
    total_tokens: int
    prompt_tokens: int | None = None  # Perplexity's; Voyage's usage has total_tokens only
    cost: Cost | None = None  # Perplexity's


class ContextualizedEmbeddingResponse(msgspec.Struct):
    data: list[DocumentEmbeddings]
    model: str
    usage: ContextualizedUsage
    object: str = "list"
