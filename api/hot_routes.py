"""HotRoutes: the POSTs that run a model (embeddings, rerank, score) are answered before Litestar's router,
by the same handler functions that Litestar registers (and documents in the OpenAPI schema). Litestar's
routing, dependency resolution, middleware and send wrapping cost about 40 us a request on a development
core, twice that on the H200's host, against a 0.7 ms batch-1 step; what its hooks and exception handler
do here is done by the same pieces (api/hooks.py, api/errors.py). Every other method or path, a trailing
slash included, goes through Litestar as before."""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute
from litestar.types import Receive, Scope, Send

from api.hooks import RequestHooks
from api.responses import EncodedJson, error_answer, json_headers


class Call:
    """What a route's handler reads of its request, as a Litestar Request carries it: the scope, the
    receive channel and the route handler (its body limit)."""

    __slots__ = ("scope", "receive", "route_handler")

    def __init__(self, scope: Scope, receive: Receive, route_handler: HTTPRouteHandler):
        self.scope, self.receive, self.route_handler = scope, receive, route_handler


class HotRoutes:
    def __init__(self, app: Litestar, server: Any, hooks: RequestHooks):
        self.server, self.hooks = server, hooks
        # path -> handler of its POST, for the handlers that answer with EncodedJson
        self.handlers: dict[str, HTTPRouteHandler] = {}
        for route in app.routes:
            if isinstance(route, HTTPRoute) and "POST" in route.route_handler_map:
                handler, _ = route.route_handler_map["POST"]
                if handler.parsed_fn_signature.return_type.annotation is EncodedJson:
                    self.handlers[route.path] = handler

    def handler_of(self, scope: Scope) -> HTTPRouteHandler | None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        return self.handlers.get(scope["path"])

    async def serve(self, handler: HTTPRouteHandler, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})
        try:
            self.hooks.arrived(scope)
            response: EncodedJson = await handler.fn(Call(scope, receive, handler), self.server)
            status, body = 200, response.body
            headers = json_headers(body)
        except Exception as error:  # answered in the API's error shape, as Litestar's handler does
            status, headers, body = error_answer(scope, error)
        headers += self.hooks.response_headers(scope)
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        finally:  # after the answer has gone (uvicorn writes it in send): off the request's path
            self.hooks.observe(scope, status, scope["path"])
