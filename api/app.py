"""create_app(config) -> Litestar: routes, dependencies, error handlers, hooks and lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Request
from litestar.di import Provide
from litestar.types import Message, Receive, Scope, Send

from api.config import ServerConfig
from api.errors import error_response
from api.head import as_get, without_body
from api.hooks import RequestHooks
from api.hot_routes import HotRoutes
from api.openapi import openapi_config
from api.routes.classify import classify
from api.routes.cohere_embed import embed_v2
from api.routes.contextualized import create_contextualized_embeddings
from api.routes.docs import docs
from api.routes.embeddings import create_embeddings
from api.routes.health import health, metrics, ready
from api.routes.models import list_models
from api.routes.pooling import pooling
from api.routes.rerank import rerank_v1, rerank_v2
from api.routes.score import score
from api.routes.tei import embed_sparse_tei, embed_tei, info_tei, rerank_tei, tokenize_tei
from api.server import Server
from engine.errors import EngineError
from engine.passing_thread import await_in_passing_thread


class PosyApp(Litestar):
    """Litestar, with the POSTs of the routes that run a model answered before its router, and HEAD
    answered as GET without the body (api/head.py)."""

    hot_routes: HotRoutes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]
        if scope["type"] == "http" and scope["method"] == "HEAD":
            await super().__call__(as_get(scope), receive, without_body(send))
            return
        handler = self.hot_routes.handler_of(scope)
        if handler is None:
            await super().__call__(scope, receive, send)
        else:
            await self.hot_routes.serve(handler, scope, receive, send)


def create_app(config: ServerConfig, server: Server | None = None) -> PosyApp:
    server = server or Server(config)
    hooks = RequestHooks(config.api_key, server.metrics, server.admission_estimates)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        # a thread of its own, not a pooled one: see engine/passing_thread.py
        try:
            await await_in_passing_thread(server.load)
        except EngineError as refusal:  # `posy serve` says why in one line (api/refusal.py)
            server.refusal = refusal
            raise
        hooks.start()
        try:
            yield
        finally:
            hooks.stop()
            await asyncio.to_thread(server.stop)

    async def before_request(request: Request) -> None:
        hooks.arrived(request.scope)

    async def before_send(message: Message, scope: Scope) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *hooks.response_headers(scope)]
            route = scope["path"] if scope.get("route_handler") is not None else "unmatched"
            hooks.observe(scope, message["status"], route)

    app = PosyApp(
        route_handlers=[
            create_embeddings,
            create_contextualized_embeddings,
            embed_v2,
            list_models,
            rerank_v1,
            rerank_v2,
            score,
            pooling,
            classify,
            rerank_tei,
            embed_tei,
            embed_sparse_tei,
            tokenize_tei,
            info_tei,
            health,
            ready,
            metrics,
            docs,
        ],
        dependencies={"server": Provide(lambda: server, sync_to_thread=False)},
        exception_handlers={Exception: error_response},
        before_request=before_request,
        before_send=[before_send],
        lifespan=[lifespan],
        request_max_body_size=config.max_body_bytes,
        openapi_config=openapi_config(),
    )
    app.hot_routes = HotRoutes(app, server, hooks)
    return app
