"""POST /v2/embed: Cohere's embed API (v2) over texts (`texts`, or `inputs` of text content), with its
embedding types (api/quantize.py), truncation from either end, output_dimension and input_type prompts."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.encoding import check_dimensions, truncate_dimensions
from api.errors import InvalidInput
from api.guard import RequestGuard
from api.inputs import check_texts
from api.models import EMBED
from api.prompts import select_prompt
from api.quantize import by_type
from api.responses import EncodedJson, documented
from api.schemas.cohere import (
    ApiVersion,
    EmbedBilledUnits,
    EmbeddingsByType,
    EmbedMeta,
    EmbedRequest,
    EmbedResponse,
)
from api.server import Server


@post(
    "/v2/embed",
    status_code=200,
    request_body=EmbedRequest,
    responses=documented(EmbedResponse, "the embeddings by type, in input order"),
)
async def embed_v2(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """Cohere's v2 embed: `texts` with an `input_type`, the vectors in each of the `embedding_types` asked
    for (float, int8, uint8, binary, ubinary, base64)."""
    data = await decode_body(request, EmbedRequest)
    if data.images:
        raise InvalidInput("this server embeds texts only: send `texts`", "images")
    given = data.texts
    if data.inputs is not None:
        if data.texts is not None:
            raise InvalidInput("send `texts` or `inputs`, not both", "inputs")
        given = input_texts(data.inputs)
    param = "texts" if data.inputs is None else "inputs"
    if not given:
        raise InvalidInput(f"{param} must be a non-empty list", param)
    check_texts(given, server.config.max_inputs, param)
    model = server.registry().get(data.model, EMBED)
    spec, encoder = model.spec, model.encoder
    check_dimensions(data.output_dimension, spec.output_dim, "output_dimension")
    max_tokens = encoder.window
    if data.max_tokens is not None:
        if not 1 <= data.max_tokens <= encoder.window:
            raise InvalidInput(
                f"max_tokens must be between 1 and the model's window of {encoder.window}", "max_tokens"
            )
        max_tokens = data.max_tokens
    prompt = select_prompt(spec.prompts, data.input_type, None, spec.default_prompt_name)
    texts = [prompt + text for text in given] if prompt else given
    truncate, keep_end = data.truncate != "NONE", data.truncate == "START"
    guard = RequestGuard(model.engine, request, server.config)
    sequences = await guard.tokenized(encoder.encode_off_loop(texts, max_tokens, truncate, keep_end, guard))
    num_tokens = sum(map(len, sequences))
    vectors = truncate_dimensions(await guard.run(sequences, rows=model.rows(EMBED)), data.output_dimension)
    server.metrics.count_prompt_tokens(model.name, num_tokens)
    types = dict.fromkeys(data.embedding_types or ["float"])  # in order, once each
    embeddings = EmbeddingsByType(**{_field(kind): by_type(vectors, kind) for kind in types})
    billed = EmbedBilledUnits(input_tokens=num_tokens)
    meta = EmbedMeta(api_version=ApiVersion(version="2"), billed_units=billed)
    return EncodedJson(EmbedResponse(id=str(uuid.uuid4()), embeddings=embeddings, texts=given, meta=meta))


def _field(embedding_type: str) -> str:
    return "float_" if embedding_type == "float" else embedding_type


def input_texts(inputs: list[Any]) -> list[str]:
    """v2's `inputs` as texts: each input's content must be one text part (an image, or several parts
    that Cohere fuses into one embedding, are not served)."""
    texts = []
    for index, item in enumerate(inputs):
        parts = item.get("content") if isinstance(item, dict) else None
        part = parts[0] if isinstance(parts, list) and len(parts) == 1 else None
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise InvalidInput(
                f"inputs[{index}]: this server embeds text; each input's content must be one part "
                '{"type": "text", "text": ...}',
                "inputs",
            )
        texts.append(part["text"])
    return texts
