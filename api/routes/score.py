"""POST /score and /v1/score: vLLM's score API. text_1 and text_2 pair up one to one, one to many (a
single text_1), or many to many (lists of one length, pairwise); each pair's score is the rerank
path's: a cross-encoder's or judge's relevance in [0, 1], or an embedding model's cosine similarity
(as vLLM scores with embedding models)."""

from __future__ import annotations

import time
import uuid

import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.config import DEFAULT_MAX_CHUNKS_PER_DOC
from api.errors import InvalidInput
from api.guard import RequestGuard
from api.inputs import check_texts
from api.models import RERANK, ServedModel
from api.responses import EncodedJson, documented
from api.routes.rerank import score_texts
from api.schemas.vllm import ScoreData, ScoreRequest, ScoreResponse, ScoreUsage
from api.server import Server
from scoring.rerank import RerankOptions


@post(
    ["/score", "/v1/score"],
    status_code=200,
    request_body=ScoreRequest,
    responses=documented(ScoreResponse, "one score per pair, in input order"),
)
async def score(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    data = await decode_body(request, ScoreRequest)
    pairs = _pairs(data.text_1, data.text_2, server.config.max_documents)
    model = server.registry().get(data.model, RERANK)
    embedder = model.spec.task == "embed"
    options = RerankOptions(max_chunks_per_doc=DEFAULT_MAX_CHUNKS_PER_DOC, raw_scores=embedder)
    guard = RequestGuard(model.engine, request, server.config)
    # one rerank call per distinct text_1, over all of its text_2s
    groups: dict[str, list[int]] = {}
    for index, (first, _) in enumerate(pairs):
        groups.setdefault(first, []).append(index)
    scores = np.empty(len(pairs))
    for first, indexes in groups.items():
        seconds = [pairs[index][1] for index in indexes]
        scores[indexes] = await score_texts(model, first, seconds, options, guard)
    num_tokens = _num_tokens(model, pairs, groups)
    response = ScoreResponse(
        id=f"score-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=data.model or model.name,
        data=[ScoreData(index=index, score=float(value)) for index, value in enumerate(scores)],
        usage=ScoreUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )
    return EncodedJson(response)


def _pairs(text_1: str | list[str], text_2: str | list[str], max_pairs: int) -> list[tuple[str, str]]:
    firsts = [text_1] if isinstance(text_1, str) else text_1
    seconds = [text_2] if isinstance(text_2, str) else text_2
    for texts, param in ((firsts, "text_1"), (seconds, "text_2")):
        if not texts:
            raise InvalidInput(f"{param} must not be empty", param)
        check_texts(texts, max_pairs, param)
    if len(firsts) == 1:
        return [(firsts[0], second) for second in seconds]
    if len(firsts) != len(seconds):
        raise InvalidInput(
            f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: "
            "give one text_1, or as many as text_2",
            "text_2",
        )
    return list(zip(firsts, seconds))


def _num_tokens(model: ServedModel, pairs: list[tuple[str, str]], groups: dict[str, list[int]]) -> int:
    """Tokens of what the model reads before any chunking: each pair as the cross-encoder's template
    joins it, or each distinct text_1 once and every text_2 for an embedding model."""
    encoder = model.encoder
    firsts = dict(zip(groups, encoder.content_ids(list(groups))))
    seconds = encoder.content_ids([second for _, second in pairs])
    if model.spec.task == "embed":
        single = encoder.single.num_special_tokens
        return sum(len(ids) + single for ids in firsts.values()) + sum(len(ids) + single for ids in seconds)
    special = encoder.pair.num_special_tokens
    return sum(len(firsts[first]) + len(ids) + special for (first, _), ids in zip(pairs, seconds))
