"""POST /v2/embed: Cohere's embed API (v2) over texts and images (`texts`, `images` as data URIs, or
`inputs` of one content part each), with its embedding types (api/quantize.py), truncation from either
end, output_dimension and input_type prompts."""

from __future__ import annotations

import uuid

from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.encoding import check_dimensions, truncate_dimensions
from api.errors import InvalidInput
from api.guard import RequestGuard
from api.image_inputs import ImageInput, Item, content_parts, embed_items
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
    """Cohere's v2 embed: `texts` with an `input_type` (or, for an image model, `images`, or `inputs` of
    texts and images), the vectors in each of the `embedding_types` asked for (float, int8, uint8, binary,
    ubinary, base64)."""
    data = await decode_body(request, EmbedRequest)
    items, param = embed_items_of(data)
    check_texts([item for item in items if isinstance(item, str)], server.config.max_inputs, param)
    if len(items) > server.config.max_inputs:
        raise InvalidInput(
            f"{param} has {len(items)} items, more than the limit of {server.config.max_inputs}", param
        )
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
    if data.input_type == "image":  # Cohere's, for images: no prompt
        if param == "texts":
            raise InvalidInput("input_type image is for images: send them as images or inputs", "input_type")
        prompt = ""
    else:
        prompt = select_prompt(spec.prompts, data.input_type, None, spec.default_prompt_name)
    truncate, keep_end = data.truncate != "NONE", data.truncate == "START"
    guard = RequestGuard(model.engine, request, server.config)
    vectors, num_tokens = await embed_items(
        model, items, guard, server.config.images, max_tokens, truncate, keep_end, prompt
    )
    vectors = truncate_dimensions(vectors, data.output_dimension)
    server.metrics.count_prompt_tokens(model.name, num_tokens)
    types = dict.fromkeys(data.embedding_types or ["float"])  # in order, once each
    embeddings = EmbeddingsByType(**{_field(kind): by_type(vectors, kind) for kind in types})
    billed = EmbedBilledUnits(input_tokens=num_tokens)
    meta = EmbedMeta(api_version=ApiVersion(version="2"), billed_units=billed)
    texts = [item for item in items if isinstance(item, str)]
    return EncodedJson(EmbedResponse(id=str(uuid.uuid4()), embeddings=embeddings, texts=texts, meta=meta))


def _field(embedding_type: str) -> str:
    return "float_" if embedding_type == "float" else embedding_type


def embed_items_of(data: EmbedRequest) -> tuple[list[Item], str]:
    """The request's inputs, in order, and the field that gave them: `texts`, `images` (data URIs) or
    `inputs` (each of content parts: one, a text or an image; several, fused, for a vision-language
    model)."""
    given = [
        (name, value)
        for name, value in (("texts", data.texts), ("images", data.images), ("inputs", data.inputs))
        if value is not None
    ]
    if len(given) != 1:
        raise InvalidInput("send one of texts, images or inputs", given[1][0] if given else "texts")
    param, values = given[0]
    if not values:
        raise InvalidInput(f"{param} must be a non-empty list", param)
    if param == "texts":
        return list(values), param
    if param == "images":
        for index, value in enumerate(values):
            if not isinstance(value, str) or not value:
                raise InvalidInput(f"images[{index}] must be a data URI", param)
        return [ImageInput(value, f"images[{index}]") for index, value in enumerate(values)], param
    items = []
    for index, item in enumerate(values):
        where = f"inputs[{index}]"
        items.append(content_parts(item.get("content") if isinstance(item, dict) else None, where))
    return items, param
