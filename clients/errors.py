"""The client's errors: what the server answered (status, message, request id), typed by what a caller
does about it."""

from __future__ import annotations


class PosyError(Exception):
    """A response other than 200, after any retries."""

    def __init__(self, status_code: int, message: str, request_id: str | None = None):
        named = f" (request id {request_id})" if request_id else ""
        super().__init__(f"HTTP {status_code}: {message}{named}")
        self.status_code = status_code
        self.message = message
        self.request_id = request_id


class InvalidRequest(PosyError):
    """4xx but 429: the request itself is wrong (input too long, unknown model, bad key...)."""


class Overloaded(PosyError):
    """429 still after the last retry: the server's queue stayed full."""


class Unavailable(PosyError):
    """5xx: the server is starting, draining or failed on the request."""


def error_for(status_code: int, message: str, request_id: str | None) -> PosyError:
    if status_code == 429:
        return Overloaded(status_code, message, request_id)
    if status_code >= 500:
        return Unavailable(status_code, message, request_id)
    return InvalidRequest(status_code, message, request_id)
