"""POST /score and /v1/score: vLLM's score API. text_1 and text_2 (or queries and documents, or data_1 and
data_2) pair up one to one, one to many (a
single text_1), or many to many (lists of one length, pairwise); each pair's score is the rerank
path's: a cross-encoder's or judge's relevance in [0, 1], or an embedding model's cosine similarity
(as vLLM scores with embedding models). Each distinct text_1 is one rerank call over its text_2s (a causal
judge runs its prompt once a batch there); the calls run together, and usage counts the tokens the model
ran."""

from __future__ import annotations

import time
import uuid

import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.config import DEFAULT_MAX_CHUNKS_PER_DOC
from api.errors import InvalidInput
from api.guard import RequestGuard, together
from api.inputs import check_query, check_texts
from api.models import RERANK
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
    """vLLM's score: pairs of texts (one to one, one to many, or pairwise lists), each pair's relevance (a
    cross-encoder's, a judge's, an embedding model's cosine, a ColBERT model's MaxSim)."""
    data = await decode_body(request, ScoreRequest)
    (first, second), names = _sides(data)
    pairs = _pairs(first, second, server.config.max_documents, names)
    model = server.registry().get(data.model, RERANK)
    embedder = model.spec.task == "embed"
    options = RerankOptions(max_chunks_per_doc=DEFAULT_MAX_CHUNKS_PER_DOC, raw_scores=embedder)
    guard = RequestGuard(model.engine, request, server.config)
    # one rerank call per distinct text_1, over all of its text_2s
    groups: dict[str, list[int]] = {}
    for index, (first, _) in enumerate(pairs):
        groups.setdefault(first, []).append(index)
    calls = [
        score_texts(model, first, [pairs[index][1] for index in indexes], options, guard)
        for first, indexes in groups.items()
    ]
    scores = np.empty(len(pairs))
    for indexes, group_scores in zip(groups.values(), await together(calls)):
        scores[indexes] = group_scores
    num_tokens = guard.num_tokens
    response = ScoreResponse(
        id=f"score-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=data.model or model.name,
        data=[ScoreData(index=index, score=float(value)) for index, value in enumerate(scores)],
        usage=ScoreUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )
    return EncodedJson(response)


# vLLM's names of the two sides, oldest first
SIDES = (("text_1", "text_2"), ("queries", "documents"), ("data_1", "data_2"))


def _sides(data: ScoreRequest) -> tuple[tuple[str | list[str], str | list[str]], tuple[str, str]]:
    """The two sides and their names, from the one pair of fields the request gives."""
    given = [names for names in SIDES if any(getattr(data, name) is not None for name in names)]
    if len(given) != 1:
        asked = " or ".join(f"{first} and {second}" for first, second in SIDES)
        raise InvalidInput(f"give {asked}" + (", not several of them" if given else ""), SIDES[0][0])
    names = given[0]
    for name, other in (names, names[::-1]):
        if getattr(data, name) is None:
            raise InvalidInput(f"{name} is missing beside {other}", name)
    return (getattr(data, names[0]), getattr(data, names[1])), names


def _pairs(
    text_1: str | list[str], text_2: str | list[str], max_pairs: int, names: tuple[str, str] = SIDES[0]
) -> list[tuple[str, str]]:
    firsts = [text_1] if isinstance(text_1, str) else text_1
    seconds = [text_2] if isinstance(text_2, str) else text_2
    for texts, param in ((firsts, names[0]), (seconds, names[1])):
        if not texts:
            raise InvalidInput(f"{param} must not be empty", param)
        check_texts(texts, max_pairs, param)
    for index, first in enumerate(firsts):  # the query side, as rerank's query
        check_query(first, names[0], None if isinstance(text_1, str) else index)
    if len(firsts) == 1:
        return [(firsts[0], second) for second in seconds]
    if len(firsts) != len(seconds):
        raise InvalidInput(
            f"{names[0]} has {len(firsts)} texts and {names[1]} {len(seconds)}: "
            f"give one {names[0]}, or as many as {names[1]}",
            names[1],
        )
    return list(zip(firsts, seconds))
