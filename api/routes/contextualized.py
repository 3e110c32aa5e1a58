"""POST /v1/contextualizedembeddings: Perplexity's contextualized embeddings (`input`) and, on the same path,
Voyage's contextualized_embed (`inputs`): a vector a chunk, each document read whole in one pass."""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.encoding import check_dimensions, encode_typed, encode_vectors, truncate_dimensions
from api.errors import BodyInvalid, InvalidInput
from api.guard import RequestGuard
from api.late_chunking import Frame, contextualized_vectors
from api.models import CONTEXTUALIZED_EMBED
from api.responses import EncodedJson, documented
from api.schemas.perplexity import (
    ContextualizedEmbeddingRequest,
    ContextualizedEmbeddingResponse,
    ContextualizedUsage,
    Cost,
    DocumentEmbeddings,
    EmbeddingObject,
)
from api.server import Server


@dataclass(frozen=True, slots=True)
class ContextualizedApi:
    """What sets one API's contextualized embeddings apart: its name, its documents' and dimensions' fields,
    its encodings (the first the default) and its limits (as each API documents them)."""

    name: str
    field: str
    dimensions_field: str
    encodings: tuple[str | None, ...]
    max_documents: int
    max_chunks: int = 16_000
    max_tokens: int = 120_000  # as the model reads them: separators and special tokens included
    other_fields: tuple[str, ...] = ()  # the other API's fields, refused rather than ignored


PERPLEXITY = ContextualizedApi(
    "Perplexity", "input", "dimensions", ("base64_int8", "base64_binary"), 512,
    other_fields=("input_type", "output_dimension", "output_dtype"),
)  # fmt: skip
VOYAGE = ContextualizedApi(
    "Voyage", "inputs", "output_dimension", (None, "base64"), 1000, other_fields=("dimensions",)
)
# Voyage's input_type prompts, as its API documents them; each document is read after its prompt
VOYAGE_PROMPTS = {
    "query": "Represent the query for retrieving supporting documents: ",
    "document": "Represent the document for retrieval: ",
}


@post(
    "/v1/contextualizedembeddings",
    status_code=200,
    request_body=ContextualizedEmbeddingRequest,
    responses=documented(ContextualizedEmbeddingResponse, "a list a document of its chunks' embeddings"),
)
async def create_contextualized_embeddings(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """Perplexity's contextualized embeddings (`input`; Voyage's with `inputs`): documents given as their
    chunks, each document read whole in one pass of the model (a contextual model's chunks joined by its
    separator), each chunk's vector the mean of its own tokens; base64 int8 or binary (Voyage: floats or
    its output_dtype)."""
    data = await decode_body(request, ContextualizedEmbeddingRequest)
    api, documents = asked(data)
    check_documents(api, documents)
    model = server.registry().get(data.model, CONTEXTUALIZED_EMBED)
    spec = model.spec
    dimensions = getattr(data, api.dimensions_field)
    check_dimensions(dimensions, spec.output_dim, api.dimensions_field)
    guard = RequestGuard(model.engine, request, server.config)
    join = spec.chunk_join
    prompt = VOYAGE_PROMPTS[data.input_type] if data.input_type is not None else ""
    frame = Frame.of(model.encoder, prompt, join.separator_id if join is not None else None)
    vectors, num_tokens = await contextualized_vectors(
        model.encoder, documents, frame, guard, api.max_tokens, api.field
    )
    server.metrics.count_prompt_tokens(model.name, num_tokens)
    native = spec.native_quantization
    embedded = []
    for index, chunks in enumerate(vectors):
        chunks = truncate_dimensions(chunks, dimensions, spec.normalize)
        if api is PERPLEXITY:
            encoded = encode_vectors(chunks, data.encoding_format or api.encodings[0], native)
        else:
            encoded = encode_typed(
                chunks, data.output_dtype or "float", data.encoding_format == "base64", native
            )
        items = [EmbeddingObject(index=place, embedding=vector) for place, vector in enumerate(encoded)]
        embedded.append(DocumentEmbeddings(index=index, data=items))
    if api is PERPLEXITY:
        usage = ContextualizedUsage(total_tokens=num_tokens, prompt_tokens=num_tokens, cost=Cost())
    else:
        usage = ContextualizedUsage(total_tokens=num_tokens)
    response = ContextualizedEmbeddingResponse(data=embedded, model=data.model or model.name, usage=usage)
    return EncodedJson(response)


def asked(data: ContextualizedEmbeddingRequest) -> tuple[ContextualizedApi, list[list[str]]]:
    """Which API the body is (Perplexity's `input`, Voyage's `inputs`) and its documents; a field or an
    encoding of the other API is a 400."""
    if data.input is None and data.inputs is None:
        raise BodyInvalid(
            "the body needs `input` (Perplexity's documents) or `inputs` (Voyage's)",
            ["body", "input"],
            "missing",
        )
    if data.input is not None and data.inputs is not None:
        raise InvalidInput("send `input` (Perplexity's) or `inputs` (Voyage's), not both", "input")
    api, documents = (PERPLEXITY, data.input) if data.input is not None else (VOYAGE, data.inputs)
    for field in api.other_fields:
        if getattr(data, field) is not None:
            raise InvalidInput(
                f"{field} is not a field of {api.name}'s API (its documents are `{api.field}`)", field
            )
    if data.encoding_format not in (None, *api.encodings):
        named = " or ".join("none" if encoding is None else encoding for encoding in api.encodings)
        raise InvalidInput(
            f"{api.name}'s encoding_format is {named}, not {data.encoding_format}", "encoding_format"
        )
    return api, documents


def check_documents(api: ContextualizedApi, documents: list[list[str]]) -> None:
    """The API's limits on documents and chunks, and no empty one; the token limits come once tokenized
    (api/late_chunking.py)."""
    field = api.field
    if not documents:
        raise InvalidInput(f"{field} must hold at least one document", field)
    if len(documents) > api.max_documents:
        raise InvalidInput(
            f"{field} has {len(documents)} documents, more than the limit of {api.max_documents} documents a "
            "request",
            field,
        )
    num_chunks = 0
    for index, chunks in enumerate(documents):
        if not chunks:
            raise InvalidInput(f"{field}[{index}] has no chunks; a document needs at least one chunk", field)
        for place, chunk in enumerate(chunks):
            if not chunk:
                raise InvalidInput(f"{field}[{index}][{place}] is an empty string", field)
        num_chunks += len(chunks)
    if num_chunks > api.max_chunks:
        raise InvalidInput(
            f"{field} has {num_chunks} chunks, more than the limit of {api.max_chunks} chunks a request",
            field,
        )
