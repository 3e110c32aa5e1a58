"""Strict decoding of a request body into its wire Struct: "64" is not an int, 2.0 is not a token id."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from litestar import Request

from api.errors import InvalidInput

T = TypeVar("T")


async def decode_body(request: Request, wire_type: type[T]) -> T:
    body = await request.body()
    try:
        return msgspec.json.decode(body, type=wire_type)
    except msgspec.ValidationError as error:
        raise InvalidInput(f"invalid request: {error}") from None
    except msgspec.DecodeError as error:
        raise InvalidInput(f"the body is not valid JSON: {error}") from None
    except UnicodeDecodeError as error:
        raise InvalidInput(f"the body is not valid UTF-8 (byte {error.start})") from None
    except RecursionError:
        # msgspec's decoder recurses once per nesting level, even through fields it skips
        raise InvalidInput("the body's JSON nests too deeply") from None
