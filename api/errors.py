"""Domain errors of the gateway and the one place that turns any error into a status code and an
error body in the shape of the API that was called (OpenAI, Cohere or TEI)."""

from __future__ import annotations

import logging
from enum import Enum

from litestar import Request, Response
from litestar.exceptions import HTTPException

from engine.errors import EngineError, EngineStopped, Overloaded, SequenceTooLong
from scoring.errors import ScoringError

logger = logging.getLogger(__name__)


class ApiError(Exception):
    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, error_type: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if error_type is not None:
            self.error_type = error_type


class InvalidInput(ApiError):
    """The request is well-formed JSON but asks for something invalid."""


class InputTooLong(InvalidInput):
    def __init__(self, index: int, num_tokens: int, max_tokens: int, param: str = "input"):
        super().__init__(
            f"input {index} has {num_tokens} tokens, more than the model's maximum of {max_tokens}; "
            "shorten it or ask for truncation (truncate_prompt_tokens, or --auto-truncate)",
            param,
        )


class ModelNotServed(ApiError):
    status_code = 404
    error_type = "not_found_error"

    def __init__(self, name: str, served: list[str]):
        super().__init__(f"the model '{name}' does not exist; served models: {', '.join(served)}", "model")


class TaskNotSupported(ApiError):
    def __init__(self, name: str, task: str):
        super().__init__(f"the model '{name}' cannot {task}", "model")


class Unauthorized(ApiError):
    status_code = 401
    error_type = "authentication_error"


class NotReady(ApiError):
    status_code = 503
    error_type = "service_unavailable"


class ApiShape(Enum):
    OPENAI = "openai"
    COHERE = "cohere"
    TEI = "tei"


def shape_of(path: str) -> ApiShape:
    if path == "/rerank":
        return ApiShape.TEI
    if path.startswith(("/v1/rerank", "/v2/")):
        return ApiShape.COHERE
    return ApiShape.OPENAI


def _status_and_error(exc: Exception) -> tuple[int, ApiError, dict[str, str]]:
    if isinstance(exc, ApiError):
        return exc.status_code, exc, {}
    if isinstance(exc, (ScoringError, SequenceTooLong)):
        return 400, ApiError(str(exc)), {}
    if isinstance(exc, Overloaded):
        return (
            429,
            ApiError(str(exc), error_type="rate_limit_exceeded"),
            {"Retry-After": str(exc.retry_after_s)},
        )
    if isinstance(exc, EngineStopped):
        return 503, ApiError(str(exc), error_type="service_unavailable"), {}
    if isinstance(exc, EngineError):
        logger.error("engine error: %s", exc)
        return 500, ApiError("the model failed on this request", error_type="server_error"), {}
    if isinstance(exc, HTTPException):
        message = "the request body is too large" if exc.status_code == 413 else exc.detail
        return exc.status_code, ApiError(message), dict(exc.headers or {})
    logger.exception("unhandled error", exc_info=exc)
    return 500, ApiError("internal server error", error_type="server_error"), {}


def error_response(request: Request, exc: Exception) -> Response:
    status, error, headers = _status_and_error(exc)
    shape = shape_of(request.url.path)
    if shape is ApiShape.COHERE:
        body: object = {"message": error.message}
    elif shape is ApiShape.TEI:
        # TEI answers invalid input with 422 and names the kind of error
        if status == 400:
            status = 422
        tei_type = {413: "Validation", 422: "Validation", 429: "Overloaded", 503: "Unhealthy"}.get(
            status, "Backend"
        )
        body = {"error": error.message, "error_type": tei_type}
    else:
        body = {
            "error": {
                "message": error.message,
                "type": error.error_type,
                "param": error.param,
                "code": status,
            }
        }
    return Response(content=body, status_code=status, headers=headers, media_type="application/json")
