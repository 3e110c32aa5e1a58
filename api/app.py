"""create_app(config) -> Litestar: routes, dependencies, error handlers, hooks and lifespan."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Request
from litestar.datastructures import Headers
from litestar.di import Provide
from litestar.types import Message, Scope

from api.config import ServerConfig
from api.errors import Unauthorized, error_response, request_id_of
from api.openapi import openapi_config
from api.routes.cohere_embed import embed_v2
from api.routes.embeddings import create_embeddings
from api.routes.health import health, metrics, ready
from api.routes.models import list_models
from api.routes.rerank import rerank_v1, rerank_v2
from api.routes.score import score
from api.routes.tei import embed_tei, info_tei, rerank_tei, tokenize_tei
from api.server import Server
from api.timing import TIMES, RequestTimes
from engine.passing_thread import await_in_passing_thread

# every other route needs the API key when one is set, /metrics and /openapi.json included
OPEN_PATHS = ("/health", "/ready")


def create_app(config: ServerConfig, server: Server | None = None) -> Litestar:
    server = server or Server(config)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        # a thread of its own, not a pooled one: see engine/passing_thread.py
        await await_in_passing_thread(server.load)
        try:
            yield
        finally:
            await asyncio.to_thread(server.stop)

    async def before_request(request: Request) -> None:
        request.scope["state"][TIMES] = RequestTimes(time.perf_counter())
        if config.api_key and request.url.path not in OPEN_PATHS:
            # headers arrive as latin-1 text: back to their bytes, against the key's UTF-8 bytes
            given = _given_key(request.headers).encode("latin-1")
            if not hmac.compare_digest(given, config.api_key.encode()):
                raise Unauthorized("a valid API key is required (Authorization: Bearer KEY)")

    async def before_send(message: Message, scope: Scope) -> None:
        if message["type"] != "http.response.start":
            return
        now = time.perf_counter()
        # none of these is a handler's own header: appended, not looked up
        headers = [*message.get("headers", ()), (b"x-request-id", request_id_of(scope).encode("latin-1"))]
        route = scope["path"] if scope.get("route_handler") is not None else "unmatched"
        times: RequestTimes | None = scope["state"].get(TIMES)
        if times is None:  # refused before the app's hooks ran (an unknown route, a body too large)
            server.metrics.observe_request(route, message["status"], 0.0)
        else:
            total_s = now - times.arrived
            headers += times.headers(total_s)
            server.metrics.observe_request(route, message["status"], total_s, times.stages())
        message["headers"] = headers

    return Litestar(
        route_handlers=[
            create_embeddings,
            embed_v2,
            list_models,
            rerank_v1,
            rerank_v2,
            score,
            rerank_tei,
            embed_tei,
            tokenize_tei,
            info_tei,
            health,
            ready,
            metrics,
        ],
        dependencies={"server": Provide(lambda: server, sync_to_thread=False)},
        exception_handlers={Exception: error_response},
        before_request=before_request,
        before_send=[before_send],
        lifespan=[lifespan],
        request_max_body_size=config.max_body_bytes,
        openapi_config=openapi_config(),
    )


def _given_key(headers: Headers) -> str:
    """The key of `Authorization: Bearer KEY` (the scheme in any case), else of `x-api-key: KEY`."""
    scheme, _, key = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer":
        return key.strip()
    return headers.get("x-api-key", "")
