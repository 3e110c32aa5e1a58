"""Wire types of vLLM's score, pooling and classify APIs (/score, /pooling, /classify)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec


class ScoreRequest(msgspec.Struct, kw_only=True):
    """vLLM names the two sides text_1 / text_2, queries / documents (its newer name) or data_1 /
    data_2; a request gives one of the three."""

    text_1: Annotated[
        str | list[str] | None,
        msgspec.Meta(description="the first side: a text, or texts paired one to one with text_2"),
    ] = None
    text_2: Annotated[
        str | list[str] | None, msgspec.Meta(description="the second side: a text or texts")
    ] = None
    queries: Annotated[str | list[str] | None, msgspec.Meta(description="vLLM's newer name of text_1")] = None
    documents: Annotated[str | list[str] | None, msgspec.Meta(description="vLLM's newer name of text_2")] = (
        None
    )
    data_1: Annotated[str | list[str] | None, msgspec.Meta(description="another name of text_1")] = None
    data_2: Annotated[str | list[str] | None, msgspec.Meta(description="another name of text_2")] = None
    model: Annotated[
        str | None,
        msgspec.Meta(
            description="a served model's name (GET /v1/models); none: the first that serves the task"
        ),
    ] = None


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
    bge-m3's ColBERT vectors), posy's "all" (bge-m3: dense_vecs, lexical_weights and colbert_vecs from
    one forward) or a head's own task ("token_classify": a token classifier's logits, a row a token); None:
    the model's own (token_embed for ColBERT, a head's own task, else embed)."""

    input: Annotated[
        str | list[str | dict[str, Any]],
        msgspec.Meta(
            description="a text or a list of texts; for a multi-vector image model's token_embed (ColQwen2) "
            'also images as content parts: {"type": "image_url", "image_url": {"url": "data:..."}}'
        ),
    ]
    model: Annotated[
        str | None,
        msgspec.Meta(
            description="a served model's name (GET /v1/models); none: the first that serves the task"
        ),
    ] = None
    task: Annotated[
        Annotated[str, msgspec.Meta(max_length=64)] | None,
        msgspec.Meta(
            description="embed: a vector a text; token_embed: one a token (ColBERT); all: bge-m3's 3 "
            "outputs; token_classify: a token classifier's logits, a row a token (GET /v1/models lists a "
            "model's tasks)",
        ),
    ] = None
    encoding_format: Annotated[
        Literal["float", "base64"], msgspec.Meta(description="base64: little-endian float32 bytes")
    ] = "float"
    truncate_prompt_tokens: Annotated[
        int | None,
        msgspec.Meta(
            description="cut each input to this many tokens (-1: the model window) instead of a 400"
        ),
    ] = None
    # posy's: "query" or "document" (the default) lays a ColBERT text out as one or the other; with
    # prompt_name, it picks an embedder's prompt as /v1/embeddings does
    input_type: Annotated[
        str | None,
        msgspec.Meta(description="query or document: a ColBERT text's layout, or an embedder's prompt"),
    ] = None
    prompt_name: Annotated[str | None, msgspec.Meta(description="a prompt of the model's by name")] = None


class PoolingData(msgspec.Struct):
    index: int
    # embed: [dim]; token_embed, token_classify: [num_tokens][dim] (base64: the [num_tokens, dim] float32
    # matrix's bytes); all: {"dense_vecs", "lexical_weights", "colbert_vecs"}
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

    input: Annotated[str | list[str], msgspec.Meta(description="a text or a list of texts")]
    model: Annotated[
        str | None,
        msgspec.Meta(
            description="a served model's name (GET /v1/models); none: the first that serves the task"
        ),
    ] = None
    truncate_prompt_tokens: Annotated[
        int | None,
        msgspec.Meta(
            description="cut each input to this many tokens (-1: the model window) instead of a 400"
        ),
    ] = None


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
