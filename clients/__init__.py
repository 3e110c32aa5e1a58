"""posy's Python client: `from clients import Client` (sync) or `AsyncClient`."""

from clients.client import AsyncClient, Client, RerankResult
from clients.errors import InvalidRequest, Overloaded, PosyError, Unavailable
from clients.retry import RetryPolicy

__all__ = [
    "AsyncClient",
    "Client",
    "InvalidRequest",
    "Overloaded",
    "PosyError",
    "RerankResult",
    "RetryPolicy",
    "Unavailable",
]
