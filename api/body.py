"""Reading and strict decoding of a request body into its wire Struct: "64" is not an int, 2.0 is not a
token id. The body is read from the ASGI channel directly, within the app's body limit (413)."""

from __future__ import annotations

import json
import math
import re
from typing import TypeVar

import msgspec
from litestar import Request
from litestar.exceptions import ClientException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge

from api.errors import READ_TIMEOUT, ApiError, BodyInvalid, ClientDisconnected

T = TypeVar("T")
# msgspec's "Expected `str`, got `int`" -> pydantic's kind of fault, as FastAPI's 422 names it
FAULT_KINDS = {
    "str": "string_type",
    "int": "int_type",
    "float": "float_type",
    "bool": "bool_type",
    "array": "list_type",
    "object": "dict_type",
}
PATH_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


async def decode_body(request: Request, wire_type: type[T]) -> T:
    body = await read_body(request)
    try:
        return msgspec.json.decode(body, type=wire_type)
    except msgspec.ValidationError as error:
        raise invalid_body(str(error)) from None
    except msgspec.DecodeError as error:
        surrogate = lone_surrogate(body)
        if surrogate is not None:  # msgspec calls a lone high surrogate "Input data was truncated"
            raise not_json(
                f"a string in the body holds a lone UTF-16 surrogate (U+{surrogate:04X}): text must be valid "
                "Unicode, each high surrogate escape followed by a low one"
            ) from None
        raise not_json(f"the body is not valid JSON: {error}") from None
    except UnicodeDecodeError as error:
        raise not_json(f"the body is not valid UTF-8 (byte {error.start})") from None
    except RecursionError:
        # msgspec's decoder recurses once per nesting level, even through fields it skips
        raise not_json("the body's JSON nests too deeply") from None


def not_json(message: str) -> BodyInvalid:
    return BodyInvalid(message, ["body"], "json_invalid")


def invalid_body(reason: str) -> BodyInvalid:
    """msgspec's ValidationError ("Expected `str`, got `int` - at `$.input[0]`") with where it points
    (FastAPI's loc: "body", then fields and indices) and its kind."""
    what, _, path = reason.partition(" - at `")
    loc: list[str | int] = ["body"]
    for field, index in PATH_STEP.findall(path.rstrip("`").removeprefix("$")):
        loc.append(field if field else int(index))
    missing = re.match(r"Object missing required field `(.+)`", what)
    expected = re.match(r"Expected `(\w+)", what)
    if missing:
        loc.append(missing.group(1))
        kind = "missing"
    elif expected:
        kind = FAULT_KINDS.get(expected.group(1), "value_error")
    else:
        kind = "literal_error" if what.startswith("Invalid enum value") else "value_error"
    return BodyInvalid(f"invalid request: {reason}", loc, kind)


def lone_surrogate(body: bytes) -> int | None:
    """The first lone surrogate code point in the body's strings, where Python's JSON reader (which takes
    them) reads the body; None otherwise. Only on the error path: msgspec refuses them itself."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str):
            for char in item:
                if 0xD800 <= ord(char) <= 0xDFFF:
                    return ord(char)
    return None


async def read_body(request: Request) -> bytes:
    """The whole body; more than the body limit, announced or sent, is a 413 before the rest is read.
    Litestar's own reader does the same through a generator and its header parsing, at about 15 us a
    request that the event loop of a busy gateway does not have."""
    limit = request.route_handler.resolve_request_max_body_size() or math.inf
    for name, value in request.scope["headers"]:
        if name == b"content-length":
            try:
                announced = int(value)
            except ValueError:
                raise ClientException(f"Invalid content-length: {value.decode('latin-1')!r}") from None
            if announced > limit:
                raise RequestEntityTooLarge
            break
    receive = request.receive
    message = await receive()
    if message["type"] == "http.disconnect":
        raise disconnected(request)
    body = message.get("body", b"")
    if not message.get("more_body", False):  # the usual case: one message
        if len(body) > limit:
            raise RequestEntityTooLarge
        return body
    chunks, size = [body], len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise disconnected(request)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestEntityTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def disconnected(request: Request) -> ApiError:
    """Why the body stopped: the client went away, or its connection answered its stall with a 408
    (api/connection_limits.py), which the metrics then count."""
    return request.scope.get("state", {}).get(READ_TIMEOUT) or ClientDisconnected()
