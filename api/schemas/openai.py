"""Wire types of OpenAI's /v1/embeddings and /v1/models, named exactly as OpenAI names them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from api.schemas.perplexity import Cost

# msgspec allows one array type per union: the route checks that list items are of one kind (texts and
# content parts, {"type": "text" | "image_url", ...}, may mix)
EmbeddingInput = str | list[str | int | list[int] | dict[str, Any]]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: Annotated[
        EmbeddingInput,
        msgspec.Meta(
            description="a text, 1 to 2048 texts (none empty) or content parts (a text, or an image: "
            '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}, for an image model), '
            "or with --accept-token-ids token-id lists",
            examples=[["a cat sat on the mat", "stocks fell"]],
        ),
    ]
    model: Annotated[str | None, msgspec.Meta(description="a served model's name (GET /v1/models)")] = None
    # unset, not null: the model's default (Perplexity's SDK sends none)
    encoding_format: Annotated[
        Literal["float", "base64", "base64_int8", "base64_binary"] | msgspec.UnsetType,
        msgspec.Meta(
            description="base64: each vector's little-endian float32 bytes; Perplexity's base64_int8 (the "
            "model's own int8, else round(127 x / max|x|)) and base64_binary (1 where x >= 0, least "
            "significant bit first); not sent: base64_int8 for a model that quantizes natively (pplx-embed), "
            "else float"
        ),
    ] = msgspec.UNSET
    dimensions: Annotated[
        int | None,
        msgspec.Meta(
            description="keep the first N values, re-normalized where the model's vectors are",
            extra_json_schema={"minimum": 1},
        ),
    ] = None
    user: Annotated[str | None, msgspec.Meta(description="OpenAI's end-user id: accepted, not used")] = None
    # vLLM's extension: truncate each input to this many tokens (-1: the model window)
    truncate_prompt_tokens: Annotated[
        int | None,
        msgspec.Meta(
            description="vLLM's: cut each input to this many tokens (-1: the model window) instead of a 400",
            extra_json_schema={"minimum": -1},
        ),
    ] = None
    # query / document (and Cohere's search_query, search_document, ...) pick the model's prompt
    input_type: Annotated[
        str | None,
        msgspec.Meta(description="query or document: picks the model's prompt", examples=["query"]),
    ] = None
    prompt_name: Annotated[str | None, msgspec.Meta(description="a prompt of the model's by name")] = None
    # Jina's: the inputs are one document's consecutive chunks, read together (api/late_chunking.py)
    late_chunking: Annotated[
        bool,
        msgspec.Meta(
            description="Jina's: the inputs are one document's chunks, read together, each pooled alone"
        ),
    ] = False


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | bytes  # bytes: base64 on the wire
    object: str = "embedding"


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    total_tokens: int
    cost: Cost | None = None  # Perplexity's, in its shape only (api/routes/embeddings.py)


class EmbeddingResponse(msgspec.Struct):
    data: list[Embedding]
    model: str
    usage: Usage
    object: str = "list"


class Model(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "posy"
    object: str = "model"
    root: str | None = None
    max_model_len: int | None = None
    # posy's additions: what the model does, its vector size, and whether shorter `dimensions`
    # keep retrieval quality (Matryoshka training) or merely cut the vector
    tasks: list[str] | None = None
    dimensions: int | None = None
    matryoshka: bool | None = None


class ModelList(msgspec.Struct):
    data: list[Model]
    object: str = "list"
