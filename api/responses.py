"""EncodedJson: a 200 whose JSON body is encoded once, by msgspec, and handed to the server as it is. A
route that returns a Struct goes through Litestar's response building (a Response, its headers, an
encoder lookup) at about 20 us a request; the routes on the hot path return this instead, and name the
Struct in the OpenAPI schema with `documented(...)`."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import Receive, Scope, Send

from api.errors import error_parts

_ENCODER = msgspec.json.Encoder()
_CONTENT_TYPE = (b"content-type", b"application/json")


class EncodedJson:
    __slots__ = ("body",)

    def __init__(self, content: Any):
        self.body = _ENCODER.encode(content)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": json_headers(self.body)})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


def json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [_CONTENT_TYPE, (b"content-length", str(len(body)).encode())]


def error_answer(scope: Scope, error: Exception) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The status, headers and encoded body of the answer to `error`, in the called API's shape."""
    status, content, extra = error_parts(scope, error)
    body = _ENCODER.encode(content)
    headers = json_headers(body)
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in extra.items()]
    return status, headers, body


def documented(wire_type: Any, description: str) -> dict[int, ResponseSpec]:
    """The `responses` of a route that returns EncodedJson of `wire_type`: its schema, and no examples
    (Litestar's would be random values: ids of random letters, an embedding of 14206562699.9)."""
    return {200: ResponseSpec(data_container=wire_type, description=description, generate_examples=False)}
