"""POST /rerank in text-embeddings-inference's shape: a bare list of {index, score[, text]}."""

from __future__ import annotations

from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.config import DEFAULT_MAX_CHUNKS_PER_DOC
from api.errors import InvalidInput
from api.guard import RequestGuard
from api.models import RERANK
from api.routes.rerank import check_documents, ranking, score_texts
from api.schemas.cohere import TeiRank, TeiRerankRequest
from api.server import Server
from scoring.rerank import RerankOptions


@post("/rerank", status_code=200, request_body=TeiRerankRequest)
async def rerank_tei(request: Request, server: NamedDependency[Server]) -> list[TeiRank]:
    data = await decode_body(request, TeiRerankRequest)
    model = server.registry().get(None, RERANK)
    if not data.query.strip():
        raise InvalidInput("query must not be empty", "query")
    check_documents(data.texts, server.config.max_documents, "texts")
    truncate = server.config.auto_truncate if data.truncate is None else data.truncate
    # truncation keeps one window per text; otherwise long texts score the max of their chunks
    options = RerankOptions(
        max_chunks_per_doc=1 if truncate else DEFAULT_MAX_CHUNKS_PER_DOC,
        raw_scores=data.raw_scores,
        instruction=data.instruction,
    )
    guard = RequestGuard(model.engine, request, server.config)
    scores = await score_texts(model, data.query, data.texts, options, guard)
    return [
        TeiRank(index=index, score=float(scores[index]), text=data.texts[index] if data.return_text else None)
        for index in ranking(scores, None)
    ]
