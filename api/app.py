"""create_app(config) -> Litestar: routes, dependencies, error handlers, hooks and lifespan."""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Request
from litestar.datastructures import MutableScopeHeaders
from litestar.di import Provide
from litestar.types import Message, Scope

from api.config import ServerConfig
from api.errors import Unauthorized, error_response
from api.routes.embeddings import create_embeddings
from api.routes.health import health, metrics, ready
from api.routes.models import list_models
from api.routes.rerank import rerank_v1, rerank_v2
from api.routes.tei import rerank_tei
from api.server import Server

OPEN_PATHS = ("/health", "/ready", "/metrics")


def create_app(config: ServerConfig, server: Server | None = None) -> Litestar:
    server = server or Server(config)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await asyncio.to_thread(server.load)
        try:
            yield
        finally:
            await asyncio.to_thread(server.stop)

    async def before_request(request: Request) -> None:
        request.scope["state"]["posy_started"] = time.perf_counter()
        if config.api_key and request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            given = given or request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), config.api_key.encode()):
                raise Unauthorized("a valid API key is required (Authorization: Bearer KEY)")

    async def before_send(message: Message, scope: Scope) -> None:
        if message["type"] != "http.response.start":
            return
        state = scope.setdefault("state", {})
        headers = MutableScopeHeaders.from_message(message)
        request_id = state.get("posy_request_id") or _incoming_request_id(scope) or uuid.uuid4().hex
        headers["x-request-id"] = request_id
        started = state.get("posy_started")
        route = scope["path"] if scope.get("route_handler") is not None else "unmatched"
        server.metrics.observe_request(
            route, message["status"], time.perf_counter() - started if started is not None else None
        )

    return Litestar(
        route_handlers=[
            create_embeddings,
            list_models,
            rerank_v1,
            rerank_v2,
            rerank_tei,
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
        openapi_config=None,
    )


def _incoming_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            return value.decode("latin-1")[:128] or None
    return None
