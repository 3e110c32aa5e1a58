"""POST /v1/rerank and /v2/rerank: Cohere's rerank API, both versions."""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.config import DEFAULT_MAX_CHUNKS_PER_DOC, DEFAULT_MAX_TOKENS_PER_DOC
from api.errors import InvalidInput
from api.guard import RequestGuard
from api.image_inputs import ImageInput, Item, content_item, single_part
from api.image_rerank import image_embedder_scores, max_sim_scores, ranker_scores
from api.images import ImageLimits
from api.inputs import check_query, check_texts
from api.models import RERANK, ServedModel
from api.responses import EncodedJson, documented
from api.schemas.cohere import (
    ApiVersion,
    BilledUnits,
    Document,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
)
from api.server import Server
from scoring.listwise import MAX_DOCUMENT_TOKENS, MAX_QUERY_TOKENS, listwise_scores
from scoring.rerank import RerankOptions, rerank_scores

# lists and objects inside a v1 document object; far deeper ones could exhaust the stack when the
# document is turned into text or returned (Python's recursion limit, which msgspec shares)
MAX_DOCUMENT_DEPTH = 64


RANKED = documented(RerankResponse, "the documents' indexes and scores, most relevant first")


@post("/v1/rerank", status_code=200, request_body=RerankRequest, responses=RANKED)
async def rerank_v1(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """Cohere's v1 rerank: the documents (strings, or objects ranked on `rank_fields`; for an image model
    also images, as Jina's {"image": ...} or vLLM's content parts), most relevant first, scores in [0, 1]; a
    long document scores its best chunk (at most `max_chunks_per_doc`)."""
    data = await decode_body(request, RerankRequest)
    chunks = _positive(data.max_chunks_per_doc, "max_chunks_per_doc") or DEFAULT_MAX_CHUNKS_PER_DOC
    options = RerankOptions(max_chunks_per_doc=chunks, instruction=data.instruction)
    return await _rerank(request, data, server, options, version="1")


@post("/v2/rerank", status_code=200, request_body=RerankRequest, responses=RANKED)
async def rerank_v2(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """Cohere's v2 rerank: as v1, each document first cut to `max_tokens_per_doc` tokens."""
    data = await decode_body(request, RerankRequest)
    max_tokens = _positive(data.max_tokens_per_doc, "max_tokens_per_doc") or DEFAULT_MAX_TOKENS_PER_DOC
    options = RerankOptions(max_tokens_per_doc=max_tokens, instruction=data.instruction)
    return await _rerank(request, data, server, options, version="2")


async def _rerank(
    request: Request, data: RerankRequest, server: Server, options: RerankOptions, version: str
) -> EncodedJson:
    model = server.registry().get(data.model, RERANK)
    query = rerank_item(data.query, "query")
    if isinstance(query, str):
        check_query(query)
    check_documents(data.documents, server.config.max_documents)
    top_n = _positive(data.top_n, "top_n")
    items = [
        document_item(document, data.rank_fields, index) for index, document in enumerate(data.documents)
    ]
    guard = RequestGuard(model.engine, request, server.config)
    ranker = model.spec.task == "score"  # else an embedder, which ranks by its vectors
    late = model.late_interaction is not None  # ranks by MaxSim of its token vectors; texts as ColBERT does
    has_images = any(isinstance(item, ImageInput) for item in [query, *items])
    if model.spec.images is not None and (has_images or not (ranker or late)):
        check_texts(
            [item for item in items if isinstance(item, str)], server.config.max_documents, "documents"
        )
        # a vision-language ranker (each pair one sequence, its images in it), a multi-vector image
        # retriever (ColQwen2: MaxSim against each document), or an image embedder (each a vector)
        score = ranker_scores if ranker else max_sim_scores if late else image_embedder_scores
        limits, reads = server.config.images, read_tokens(model, options)
        scores = await score(model, query, items, options, guard, limits, reads)
    else:
        images = [item for item in [query, *items] if isinstance(item, ImageInput)]
        if images:
            where = images[0].param
            raise InvalidInput(
                f"{where} is an image, and the model '{model.name}' ranks text only: images need an image "
                "model (CLIP, SigLIP)",
                where.split("[")[0],
            )
        check_texts(items, server.config.max_documents, "documents")  # type: ignore[arg-type]
        scores = await score_texts(model, query, items, options, guard)  # type: ignore[arg-type]
    results = [
        RerankResult(
            index=index,
            relevance_score=float(scores[index]),
            document=_returned(data.documents[index]) if data.return_documents else None,
        )
        for index in ranking(scores, top_n)
    ]
    meta = RerankMeta(api_version=ApiVersion(version=version), billed_units=BilledUnits(search_units=1))
    return EncodedJson(RerankResponse(id=str(uuid.uuid4()), results=results, meta=meta))


async def score_texts(
    model: ServedModel, query: str, texts: list[str], options: RerankOptions, guard: RequestGuard
) -> np.ndarray:
    """The documents' scores; the model's engine is reached through the request's guard. The query and
    documents are cut to the characters of what rerank reads of them (read_tokens) before they are
    tokenized: their first tokens are the whole text's, and a 7 MB document costs no 7 MB of
    tokenization."""
    query_tokens, document_tokens = read_tokens(model, options)
    if model.spec.images is not None and model.spec.task == "embed":  # as /v1 and /v2 rerank score them
        reads = (query_tokens, document_tokens)
        # (texts only: no image's limits apply)
        return await image_embedder_scores(model, query, texts, options, guard, ImageLimits(), reads)  # type: ignore[arg-type]
    bound, most = model.encoder.bound, max(query_tokens, document_tokens)
    query, texts = bound.cut(query, query_tokens), [bound.cut(text, document_tokens) for text in texts]
    if model.listwise is not None:
        tokenize = functools.partial(model.encoder.content_ids_off_loop, admission=guard, max_tokens=most)
        listwise = dataclasses.replace(model.listwise, engine=guard, tokenize=tokenize)
        return await listwise_scores(listwise, query, texts, options)
    encoder = model.encoder
    rerank_model = dataclasses.replace(model.rerank, engine=guard)
    prompted = rerank_model.texts(query, texts, options.instruction)
    ids = await guard.tokenized(encoder.content_ids_off_loop(prompted, guard, most))
    return await rerank_scores(rerank_model, ids[0], ids[1:], options)


def read_tokens(model: ServedModel, options: RerankOptions) -> tuple[int, int]:
    """The tokens rerank reads of a query (the window) and of a document (max_tokens_per_doc, or its
    max_chunks_per_doc windows); a listwise ranker's own limits."""
    window = model.spec.max_seq_length
    document_tokens = options.max_tokens_per_doc or (options.max_chunks_per_doc or 1) * window
    if model.listwise is not None:
        return MAX_QUERY_TOKENS, min(document_tokens, MAX_DOCUMENT_TOKENS)
    return window, document_tokens


def ranking(scores: np.ndarray, top_n: int | None) -> list[int]:
    """Document indexes by descending score; ties keep input order."""
    order = np.argsort(-scores, kind="stable").tolist()
    return order[:top_n] if top_n is not None else order


def check_documents(documents: Sequence[object], max_documents: int, param: str = "documents") -> None:
    if not documents:
        raise InvalidInput(f"{param} must not be empty", param)
    if len(documents) > max_documents:
        raise InvalidInput(
            f"{param} has {len(documents)} items, more than the limit of {max_documents}", param
        )


def document_item(document: Document, rank_fields: list[str] | None, index: int) -> Item:
    """A document's text (document_text), or its image (image_item)."""
    if isinstance(document, dict) and rank_fields is None:
        item = rerank_item(document, f"documents[{index}]")
        if item is not None:
            return item
    return document_text(document, rank_fields, index)


def rerank_item(value: Any, where: str) -> Item | None:
    """A query or document object that is an image, or one content part, as multimodal rerank APIs send
    them: Jina's {"image": ...}, vLLM's {"content": [part]} or the part itself; a string is a text; None:
    an object of neither kind (a v1 document's fields). For the query, anything else is refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if isinstance(value.get("image"), str) and "text" not in value:
            return ImageInput(value["image"], where)
        if "content" in value and "text" not in value:
            return single_part(value["content"], where)
        if value.get("type") in ("image_url", "text"):
            return content_item(value, where)
    if where == "query":
        raise InvalidInput(
            'query must be a string, or an image as {"image": "data:image/png;base64,..."} or '
            '{"content": [{"type": "image_url", "image_url": {"url": ...}}]}',
            "query",
        )
    return None


def document_text(document: Document, rank_fields: list[str] | None, index: int) -> str:
    """A string as is; an object's `text`, or its rank_fields as "field: value" lines."""
    if isinstance(document, str):
        return document
    if _nesting_depth(document) > MAX_DOCUMENT_DEPTH:
        raise InvalidInput(f"document {index} nests deeper than {MAX_DOCUMENT_DEPTH} levels", "documents")
    fields = rank_fields or ["text"]
    missing = [field for field in fields if field not in document]
    if missing:
        raise InvalidInput(f"document {index} has no field {', '.join(missing)}", "documents")
    for field in fields:
        if not isinstance(document[field], str):
            kind = "null" if document[field] is None else type(document[field]).__name__
            raise InvalidInput(f"document {index}'s {field!r} must be a string, not {kind}", "documents")
    if rank_fields is None:
        return document["text"]
    return "\n".join(f"{field}: {document[field]}" for field in fields)


def _nesting_depth(value: Any) -> int:
    """Levels of lists and objects in a value, counted level by level without recursion."""
    depth, level = 0, [value]
    while level := [item for item in level if isinstance(item, (list, dict))]:
        depth += 1
        if depth > MAX_DOCUMENT_DEPTH:
            break
        level = [child for item in level for child in (item.values() if isinstance(item, dict) else item)]
    return depth


def _returned(document: Document) -> dict[str, Any]:
    return {"text": document} if isinstance(document, str) else document


def _positive(value: int | None, param: str) -> int | None:
    if value is not None and value < 1:
        raise InvalidInput(f"{param} must be at least 1, not {value}", param)
    return value
