"""Wire types of OpenAI's /v1/embeddings and /v1/models, named exactly as OpenAI names them."""

from __future__ import annotations

from typing import Literal

import msgspec

# msgspec allows one array type per union: the route checks that list items are of one kind
EmbeddingInput = str | list[str | int | list[int]]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: EmbeddingInput
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    # vLLM's extension: truncate each input to this many tokens (-1: the model window)
    truncate_prompt_tokens: int | None = None
    # query / document (and Cohere's search_query, search_document, ...) pick the model's prompt
    input_type: str | None = None
    prompt_name: str | None = None
    # Jina's: the inputs are one document's consecutive chunks, read together (api/late_chunking.py)
    late_chunking: bool = False


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | bytes  # bytes: base64 on the wire
    object: str = "embedding"


class Usage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


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
