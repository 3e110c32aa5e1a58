"""Domain errors of the gateway and the one place that turns any error into a status code and an
error body in the shape of the API that was called (OpenAI, Cohere, TEI or Perplexity)."""

from __future__ import annotations

import logging
import os
from enum import Enum

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.types import Scope

from engine.errors import EngineError, EngineStopped, NeverInTime, Overloaded, SequenceTooLong
from scoring.errors import ScoringError

logger = logging.getLogger(__name__)


class ApiError(Exception):
    status_code = 400
    # TEI answers invalid input with 422
    tei_status_code = 422
    error_type = "invalid_request_error"
    # OpenAI's error `code`: a string where OpenAI names the fault (its SDK's APIError.code), else null
    code: str | None = None

    def __init__(
        self, message: str, param: str | None = None, error_type: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        if error_type is not None:
            self.error_type = error_type
        if code is not None:
            self.code = code

    def message_for(self, shape: ApiShape) -> str:
        """The message as the API that was called words it (an error that names a field names its own)."""
        return self.message


class InvalidInput(ApiError):
    """The request is well-formed JSON but asks for something invalid."""


class InputTooLong(InvalidInput):
    """Input `index` is too long: `figures` say how long, against which limit (of_tokens, of_characters)."""

    code = "context_length_exceeded"

    def __init__(self, index: int, figures: str, param: str = "input"):
        self.index, self.figures = index, figures
        super().__init__(self.message_for(ApiShape.OPENAI), param)

    @classmethod
    def of_tokens(cls, index: int, num_tokens: int, max_tokens: int, param: str = "input") -> InputTooLong:
        return cls(index, f"has {num_tokens} tokens, more than the model's maximum of {max_tokens}", param)

    @classmethod
    def of_characters(
        cls, index: int, num_chars: int, max_chars: int, max_tokens: int, param: str = "input"
    ) -> InputTooLong:
        """Refused untokenized: longer than `max_tokens` tokens can span (api/char_bound.py)."""
        return cls(
            index,
            f"has {num_chars} characters, more than the {max_chars} that the model's maximum of {max_tokens} "
            "tokens reads",
            param,
        )

    def renumbered(self, index: int) -> InputTooLong:
        """The same refusal of the request's input `index` (an encoder numbers the texts it was given)."""
        return InputTooLong(index, self.figures, self.param or "input")

    def message_for(self, shape: ApiShape) -> str:
        fields = TRUNCATION_FIELDS.get(shape)
        if fields is None:  # an API that never truncates
            return f"input {self.index} {self.figures}; shorten it"
        return f"input {self.index} {self.figures}; shorten it or ask for truncation ({fields})"


class BodyInvalid(InvalidInput):
    """The body is not JSON, or not of the request's wire type: where (`loc`, FastAPI's: "body" then the
    fields and indices) and what kind of fault (`kind`, pydantic's names: "missing", "string_type", ...).
    Perplexity's shape answers it as FastAPI does, 422 with a list of faults; the others as invalid input."""

    def __init__(self, message: str, loc: list[str | int], kind: str):
        super().__init__(message)
        self.loc, self.kind = loc, kind


class RequestTooLarge(InvalidInput):
    tei_status_code = 413

    def __init__(self, num_tokens: int, max_tokens: int, param: str = "input"):
        super().__init__(
            f"the request has {num_tokens} tokens after tokenization, more than the limit of {max_tokens} "
            "tokens a request (--max-request-tokens); send fewer or shorter inputs",
            param,
        )


class OutputTooLarge(InvalidInput):
    """Outputs past what one request holds (a vector a token, a vocabulary's weights a text); TEI: 413."""

    tei_status_code = 413

    def __init__(self, num_rows: int, rows_of: str, width: int, max_floats: int, param: str = "input"):
        super().__init__(
            f"the request's outputs would be {num_rows} {rows_of} x {width} = {num_rows * width} floats, "
            f"more than the {max_floats} one request holds; send fewer or shorter texts",
            param,
        )


class RequestTooLong(InvalidInput):
    """Work that would outlast --request-timeout even on an idle server (TEI: 413, too large)."""

    tei_status_code = 413


class RequestTimeout(ApiError):
    status_code = 504
    error_type = "timeout"
    refusal = "timeout"

    def __init__(self, waited_s: float, timeout_s: float):
        super().__init__(
            f"the request was still waiting on the model after {waited_s:.1f} s, past its --request-timeout "
            f"of {timeout_s:g} s; its queued work was dropped"
        )


class ReadTimeout(ApiError):
    """The client sent its request's head or body too slowly (api/connection_limits.py): 408, and the
    connection closes."""

    status_code = 408
    error_type = "timeout"

    def __init__(self, part: str, timeout_s: float, flag: str):
        super().__init__(
            f"the request's {part} did not arrive whole within {timeout_s:g} s ({flag}); the connection is "
            "closed"
        )


class ClientDisconnected(ApiError):
    """The client went away while its request waited on the model; nobody reads this answer, but the
    status (nginx's 499) shows in the metrics."""

    status_code = 499
    error_type = "client_closed_request"

    def __init__(self) -> None:
        super().__init__("the client disconnected; its queued work was dropped")


class ModelNotServed(ApiError):
    status_code = 404
    error_type = "not_found_error"
    code = "model_not_found"

    def __init__(self, name: str, served: list[str]):
        super().__init__(f"the model '{name}' does not exist; served models: {', '.join(served)}", "model")


class TaskNotSupported(ApiError):
    def __init__(self, name: str, task: str, served: list[str] | None = None):
        what = f"; it serves {', '.join(served)}" if served else ""
        super().__init__(f"the model '{name}' cannot {task}{what}", "model")


class Unauthorized(ApiError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class NotReady(ApiError):
    """503 with a Retry-After: loading, draining, or no engine replica of a model running. `close`: the
    server is draining, and the answer closes its connection (Connection: close), so that the client's
    next request opens a new one, which the listener takes or refuses, and none is sent down a kept-alive
    connection as the server closes it."""

    status_code = 503
    error_type = "service_unavailable"
    refusal = "not_ready"

    def __init__(self, message: str, retry_after_s: int = 1, close: bool = False):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.close = close


# a 503's Retry-After where no engine replica of a model runs: the seconds a restarted replica takes to
# load a small model and warm up
RESTART_RETRY_S = 5


class ApiShape(Enum):
    OPENAI = "openai"
    COHERE = "cohere"
    TEI = "tei"
    # Perplexity's (FastAPI's) {"detail": ...}, which Voyage's contextualized embeddings share
    PERPLEXITY = "perplexity"


# how each API asks for an over-long input to be truncated instead of refused
TRUNCATION_FIELDS = {
    ApiShape.OPENAI: "truncate_prompt_tokens, or --auto-truncate",
    ApiShape.COHERE: 'truncate "END" or "START"',
    ApiShape.TEI: "truncate: true, or --auto-truncate",
}
TEI_PATHS = frozenset({"/embed", "/embed_sparse", "/rerank", "/tokenize", "/info"})
PERPLEXITY_PATHS = frozenset({"/v1/contextualizedembeddings"})
# the kind of error TEI names beside each status; any other is "Backend"
TEI_ERROR_TYPES = {
    408: "Validation",
    413: "Validation",
    422: "Validation",
    429: "Overloaded",
    503: "Unhealthy",
}


def shape_of(path: str) -> ApiShape:
    if path in TEI_PATHS:
        return ApiShape.TEI
    if path in PERPLEXITY_PATHS:
        return ApiShape.PERPLEXITY
    if path.startswith(("/v1/rerank", "/v2/")):
        return ApiShape.COHERE
    return ApiShape.OPENAI


REQUEST_ID = "posy_request_id"
# why a request was refused for time or load (an error's `refusal`), for the metrics and api/refusals.py
REFUSAL = "posy_refusal"
# where the connection's protocol leaves the ReadTimeout it answered a stalled body with, for the
# request's own reader to raise (api/body.py), so that the metrics count a 408 rather than a 499
READ_TIMEOUT = "posy_read_timeout"
MAX_REQUEST_ID_CHARS = 128


def request_id_of(scope: Scope) -> str:
    """The request's id: the caller's x-request-id (cut to 128 characters) or a new one, kept in the
    scope's state so that the response header, the log and a 500 body name the same id."""
    state = scope.setdefault("state", {})
    if REQUEST_ID not in state:
        incoming = dict(scope.get("headers", [])).get(b"x-request-id", b"")
        state[REQUEST_ID] = incoming.decode("latin-1")[:MAX_REQUEST_ID_CHARS] or os.urandom(16).hex()
    return state[REQUEST_ID]


def _status_and_error(exc: Exception, request_id: str) -> tuple[int, ApiError, dict[str, str]]:
    if isinstance(exc, Unauthorized):
        return exc.status_code, exc, {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, NotReady):
        headers = {"Retry-After": str(exc.retry_after_s)}
        return exc.status_code, exc, {**headers, "Connection": "close"} if exc.close else headers
    if isinstance(exc, ApiError):
        return exc.status_code, exc, {}
    if isinstance(exc, (ScoringError, SequenceTooLong)):
        return 400, ApiError(str(exc)), {}
    if isinstance(exc, NeverInTime):
        return 400, RequestTooLong(str(exc), "input"), {}
    if isinstance(exc, Overloaded):
        return (
            429,
            ApiError(str(exc), error_type="rate_limit_exceeded", code="rate_limit_exceeded"),
            {"Retry-After": str(exc.retry_after_s)},
        )
    if isinstance(exc, EngineStopped):  # a replica restarting, or the server stopping: worth a retry soon
        return (
            503,
            ApiError(str(exc), error_type="service_unavailable"),
            {"Retry-After": str(RESTART_RETRY_S)},
        )
    extra = {"request_id": request_id}
    if isinstance(exc, EngineError):
        logger.error("request %s: engine error: %s", request_id, exc, extra=extra)
        message = f"the model failed on this request (request id {request_id})"
        return 500, ApiError(message, error_type="server_error"), {}
    if isinstance(exc, HTTPException):
        message = "the request body is too large" if exc.status_code == 413 else exc.detail
        if exc.status_code >= 500:
            logger.error("request %s: %s", request_id, message, extra=extra)
            message = f"{message} (request id {request_id})"
        return exc.status_code, ApiError(message), dict(exc.headers or {})
    # the traceback goes to the log only, under the id the client sees in its body and header
    logger.exception("request %s: unhandled error", request_id, exc_info=exc, extra=extra)
    return 500, ApiError(f"internal server error (request id {request_id})", error_type="server_error"), {}


def error_response(request: Request, exc: Exception) -> Response:
    status, body, headers = error_parts(request.scope, exc)
    return Response(content=body, status_code=status, headers=headers, media_type="application/json")


def error_parts(scope: Scope, exc: Exception) -> tuple[int, dict, dict[str, str]]:
    """The status, the body in the called API's shape, and the headers of the answer to `exc`; a refusal
    for time or load leaves why in the scope's state (REFUSAL), and every 5xx a line in the log (500s as
    their error is logged)."""
    request_id = request_id_of(scope)
    status, error, headers = _status_and_error(exc, request_id)
    refusal = getattr(exc, "refusal", None)
    if refusal is not None:
        scope.setdefault("state", {})[REFUSAL] = refusal
    if status in (503, 504):
        logger.warning(
            "request %s: %d on %s: %s", request_id, status, scope.get("path", ""), error.message,
            extra={"request_id": request_id},
        )  # fmt: skip
    shape = shape_of(scope["path"])
    message = error.message_for(shape)
    if shape is ApiShape.COHERE:
        body: dict = {"message": message}
    elif shape is ApiShape.TEI:
        # TEI answers invalid input with 422 (a request too large: 413) and names the kind of error
        if status == 400:
            status = error.tei_status_code
        body = {"error": message, "error_type": TEI_ERROR_TYPES.get(status, "Backend")}
    elif shape is ApiShape.PERPLEXITY:
        if isinstance(error, BodyInvalid):  # FastAPI's request validation error
            status, body = 422, {"detail": [{"loc": error.loc, "msg": message, "type": error.kind}]}
        else:
            body = {"detail": message}
    else:
        body = {
            "error": {
                "message": message,
                "type": error.error_type,
                "param": error.param,
                "code": error.code,
            }
        }
    return status, body, headers
