"""POST /pooling (vLLM's pooling API) and /v1/pooling: a text's pooled vector ("embed"), its token vectors
("token_embed": a ColBERT model's, a query's or a document's as `input_type` says, or bge-m3's ColBERT
vectors), bge-m3's three outputs from one forward ("all"), or the rows of a head's own task (a token
classifier's "token_classify": a row of logits a token), as its HeadOutput declares them."""

from __future__ import annotations

import dataclasses
import time
import uuid

import msgspec
import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.config import MAX_TOKEN_OUTPUT_FLOATS
from api.errors import InvalidInput, OutputTooLarge
from api.guard import RequestGuard
from api.image_inputs import ImageInput, content_item, decoded_images, image_document
from api.inputs import check_texts
from api.models import EMBED, TASK_ROUTES, TOKEN_EMBED, ServedModel
from api.prompts import select_prompt
from api.quantize import float_json
from api.responses import EncodedJson, documented
from api.routes.embeddings import truncation
from api.schemas.vllm import PoolingData, PoolingRequest, PoolingResponse, ScoreUsage
from api.server import Server
from engine.outputs import ALL_ROWS
from scoring.late_interaction import QUERY_INPUT_TYPES, split_rows
from scoring.m3_rows import m3_outputs, unused_token_ids


@post(
    ["/pooling", "/v1/pooling"],
    status_code=200,
    request_body=PoolingRequest,
    responses=documented(PoolingResponse, "each text's pooled output, in input order"),
)
async def pooling(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """vLLM's pooling: each text's pooled vector (`embed`), its token vectors (`token_embed`: ColBERT,
    bge-m3's ColBERT vectors), or bge-m3's dense, lexical and ColBERT outputs at once (`all`)."""
    data = await decode_body(request, PoolingRequest)
    inputs = [data.input] if isinstance(data.input, str) else data.input
    if not inputs:
        raise InvalidInput("input must not be empty", "input")
    items = [
        item if isinstance(item, str) else content_item(item, f"input[{index}]")
        for index, item in enumerate(inputs)
    ]
    # (an image counts among the inputs; its place names it, never empty)
    check_texts(
        [item if isinstance(item, str) else item.param for item in items], server.config.max_inputs, "input"
    )
    texts = [item for item in items if isinstance(item, str)]
    task = data.task or _own_task(server, data.model)
    if task in TASK_ROUTES and task not in (EMBED, TOKEN_EMBED):
        raise InvalidInput(
            f"/pooling serves embed, token_embed, all (bge-m3) and a head's own task, not '{task}' "
            f"({TASK_ROUTES[task]} serves it; GET /v1/models lists each model's tasks)",
            "task",
        )
    model = server.registry().get(data.model, TOKEN_EMBED if task == "all" else task)
    if task == "all" and not model.spec.m3:
        raise InvalidInput(f"task 'all' is bge-m3's; the model '{model.name}' has no such outputs", "task")
    guard = RequestGuard(model.engine, request, server.config)
    is_query = data.input_type in QUERY_INPUT_TYPES
    sequences: list[list[int]] = []
    if texts:
        sequences = await guard.tokenized(
            _token_ids(model, texts, data, is_query, server.config.auto_truncate, guard)
        )
    output = model.engine.output
    asked = ALL_ROWS if task == "all" else model.rows(task)  # bge-m3's all: its whole token rows
    if len(texts) < len(items):  # images among them
        sequences, grids = await _with_images(model, task, items, sequences, guard, server, is_query)
        asked = dataclasses.replace(asked, images=grids)
    num_tokens = sum(map(len, sequences))
    width = asked.width(output)
    token_rows = output.token_rows and not asked.first_rows
    if task != EMBED and token_rows and num_tokens * width > MAX_TOKEN_OUTPUT_FLOATS:
        raise OutputTooLarge(num_tokens, "tokens", width, MAX_TOKEN_OUTPUT_FLOATS)
    rows = await guard.run(sequences, rows=asked)
    server.metrics.count_prompt_tokens(model.name, num_tokens)
    if task == EMBED:
        items = [_vectors(vector, data.encoding_format) for vector in rows]
    elif task == TOKEN_EMBED:
        token_vectors = _token_vectors(model, sequences, rows, is_query)
        items = [_vectors(vectors, data.encoding_format) for vectors in token_vectors]
    elif task != "all":  # a head's own task: its rows as it gives them, a text's matrix or vector
        parts = split_rows(rows, [len(ids) for ids in sequences]) if token_rows else rows
        items = [_vectors(part, data.encoding_format) for part in parts]
    else:
        unused = unused_token_ids(model.encoder.tokenizer, model.spec.path)
        items = [
            {
                "dense_vecs": _vectors(m3.dense, data.encoding_format),
                "lexical_weights": {str(token): weight for token, weight in m3.lexical.items()},
                "colbert_vecs": _vectors(m3.colbert, data.encoding_format),
            }
            for m3 in m3_outputs(rows, sequences, unused, output)
        ]
    response = PoolingResponse(
        id=f"pool-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=data.model or model.name,
        data=[PoolingData(index=index, data=item) for index, item in enumerate(items)],
        usage=ScoreUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )
    return EncodedJson(response)


async def _with_images(
    model: ServedModel, task: str, items: list, text_sequences: list[list[int]], guard: RequestGuard,
    server: Server, is_query: bool,
) -> tuple[list[list[int]], list[np.ndarray | None]]:  # fmt: skip
    """The sequences of texts and images in order, and each one's image: a multi-vector image model's image
    document laid out as its processor lays it out (LateInteraction.image_texts), its vision tokens in it."""
    late = model.late_interaction
    images = [item for item in items if isinstance(item, ImageInput)]
    around = late.image_texts() if late is not None and task == TOKEN_EMBED else None
    if around is None:
        raise InvalidInput(
            f"{images[0].param} is an image: /pooling takes images for a multi-vector image model's "
            "token_embed (ColQwen2); /v1/embeddings and Cohere's /v2/embed embed images with the other image "
            "models",
            "input",
        )
    if is_query:
        raise InvalidInput(
            f"{images[0].param} is an image, and input_type asks for queries: the model '{model.name}' "
            "embeds a query from its text, an image as a document",
            "input_type",
        )
    decoded = iter(await decoded_images(model, images, guard, server.config.images))
    ids = model.encoder.content_ids(around)
    texts = iter(text_sequences)
    sequences, grids = [], []
    for item in items:
        grid = next(decoded) if isinstance(item, ImageInput) else None
        sequences.append(next(texts) if grid is None else image_document(model, ids, grid, item.param))
        grids.append(grid)
    return sequences, grids


def _own_task(server: Server, name: str | None) -> str:
    """A request without a task gets its model's own that /pooling serves: embed for an embedder (bge-m3
    too), token_embed for a ColBERT model, a head's own task (token_classify); else embed, which the model
    lookup refuses by name."""
    models = server.registry().models
    named = models if name is None else [model for model in models if name in model.names]
    if not named:
        return EMBED
    pooled = [task for task in named[0].tasks if task in (EMBED, TOKEN_EMBED) or task not in TASK_ROUTES]
    return pooled[0] if pooled else EMBED


async def _token_ids(
    model: ServedModel,
    texts: list[str],
    data: PoolingRequest,
    is_query: bool,
    auto_truncate: bool,
    guard: RequestGuard,
) -> list[list[int]]:
    encoder, late = model.encoder, model.late_interaction
    if late is not None:  # cut to the model's query or document length, as its own encode does
        room = late.content_room(is_query)
        texts = [late.laid_out_text(text, is_query) for text in encoder.bounded(texts, room)]
        content = await encoder.content_ids_off_loop(texts, guard, room)
        return [late.query_ids(ids) if is_query else late.document_ids(ids) for ids in content]
    spec = model.spec
    prompt = select_prompt(spec.prompts, data.input_type, data.prompt_name, spec.default_prompt_name)
    prompted, texts = encoder.prompted(texts, prompt)
    max_tokens, truncate = truncation(data.truncate_prompt_tokens, encoder.window, auto_truncate)
    return await prompted.encode_off_loop(texts, max_tokens, truncate, admission=guard)


def _token_vectors(
    model: ServedModel, sequences: list[list[int]], rows: np.ndarray, is_query: bool
) -> list[np.ndarray]:
    """Each text's token vectors: a ColBERT model's that count (a document's punctuation left out), or
    bge-m3's ColBERT vectors (every token's but [CLS]'s, whose row holds the dense vector)."""
    late = model.late_interaction
    parts = split_rows(rows, [len(ids) for ids in sequences])
    if late is not None:
        return [late.kept(ids, part, is_query) for ids, part in zip(sequences, parts)]
    return [part[1:] for part in parts]


def _vectors(vectors: np.ndarray, encoding_format: str) -> msgspec.Raw | bytes:
    """Floats as lists (api/quantize.float_json), or base64 of the little-endian float32 array (a matrix
    row by row)."""
    if encoding_format == "base64":
        return vectors.astype("<f4").tobytes()
    return float_json(vectors)
