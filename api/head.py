"""HEAD requests: answered as GET is, headers and status alike (Content-Length too), without the body; load
balancers probe /health and /ready with HEAD."""

from __future__ import annotations

from litestar.types import Message, Scope, Send


def as_get(scope: Scope) -> Scope:
    """The request as a GET, for the router; the server's own scope stays a HEAD."""
    return {**scope, "method": "GET"}  # type: ignore[return-value]


def without_body(send: Send) -> Send:
    async def send_head(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}  # type: ignore[assignment]
        await send(message)

    return send_head
