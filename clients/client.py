"""Client and AsyncClient: posy's embeddings (OpenAI's /v1/embeddings) and rerank (Cohere's /v2/rerank)
over httpx, retried per RetryPolicy (429 and 503 after their Retry-After). Vectors travel as base64
float32 (a quarter of the JSON) and come back as lists, or as one numpy array when asked."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from clients.errors import error_for
from clients.retry import RetryPolicy

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_RETRY = RetryPolicy()
# (retry number, the status that caused it or None for a failed connection, seconds about to be waited)
RetryHook = Callable[[int, int | None, float], None]


@dataclass(frozen=True, slots=True)
class RerankResult:
    index: int  # of the document in the list sent
    relevance_score: float
    document: str | None = None  # the text, when return_documents was asked for


class _Calls:
    """What both clients share: the request bodies, the parsing of answers and errors."""

    def __init__(self, base_url: str, api_key: str | None, retry: RetryPolicy, on_retry: RetryHook | None):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.retry = retry
        self.on_retry = on_retry

    @staticmethod
    def embeddings_body(texts: Sequence[str], model: str | None, dimensions: int | None, **extra) -> dict:
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not one string")
        body: dict[str, Any] = {"input": list(texts), "encoding_format": "base64", **extra}
        if model is not None:
            body["model"] = model
        if dimensions is not None:
            body["dimensions"] = dimensions
        return body

    @staticmethod
    def embeddings(payload: dict, as_numpy: bool) -> np.ndarray | list[list[float]]:
        rows = sorted(payload["data"], key=lambda item: item["index"])
        vectors = np.stack([np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4") for row in rows])
        return vectors if as_numpy else vectors.tolist()

    @staticmethod
    def rerank_body(
        query: str, documents: Sequence[str], model: str | None, top_n: int | None, return_documents: bool
    ) -> dict:
        body: dict[str, Any] = {
            "query": query, "documents": list(documents), "return_documents": return_documents
        }  # fmt: skip
        if model is not None:
            body["model"] = model
        if top_n is not None:
            body["top_n"] = top_n
        return body

    @staticmethod
    def ranking(payload: dict) -> list[RerankResult]:
        return [
            RerankResult(
                result["index"], result["relevance_score"], (result.get("document") or {}).get("text")
            )
            for result in payload["results"]
        ]

    def next_delay(self, attempt: int, response: httpx.Response | None) -> float | None:
        status = None if response is None else response.status_code
        retry_after = None if response is None else response.headers.get("retry-after")
        delay = self.retry.delay(attempt, status, retry_after)
        if delay is not None and self.on_retry is not None:
            self.on_retry(attempt, status, delay)
        return delay

    @staticmethod
    def raise_for(response: httpx.Response) -> None:
        if response.status_code == 200:
            return
        raise error_for(response.status_code, _message(response), response.headers.get("x-request-id"))


class _Attempts:
    """One call's tries: after each, None (done: the answer is a 200) or the seconds to wait before the
    next; an answer or error that is not retried is raised."""

    def __init__(self, calls: _Calls):
        self.calls = calls
        self.attempt = 0

    def after(self, response: httpx.Response) -> float | None:
        self.attempt += 1
        if response.status_code == 200:
            return None
        delay = self.calls.next_delay(self.attempt, response)
        if delay is None:
            self.calls.raise_for(response)
        return delay

    def after_error(self, error: httpx.TransportError) -> float:
        self.attempt += 1
        delay = self.calls.next_delay(self.attempt, None)
        if delay is None:
            raise error
        return delay


def _message(response: httpx.Response) -> str:
    """The message of any of posy's error shapes (OpenAI, Cohere, TEI), else the body's start."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
        if "message" in body:
            return str(body["message"])
    return str(body)[:200]


class Client:
    """Blocking. `with Client(base_url) as client: client.embed([...])`."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        on_retry: RetryHook | None = None,
        http: httpx.Client | None = None,
    ):
        self._calls = _Calls(base_url, api_key, retry, on_retry)
        self._http = http or httpx.Client(timeout=timeout)
        self._owns_http = http is None

    def embed(
        self, texts: Sequence[str], model: str | None = None, dimensions: int | None = None,
        as_numpy: bool = False, **extra: Any,
    ) -> np.ndarray | list[list[float]]:  # fmt: skip
        """One vector per text, in order; `extra` fields go into the body (input_type, prompt_name...)."""
        body = self._calls.embeddings_body(texts, model, dimensions, **extra)
        return self._calls.embeddings(self._post("/v1/embeddings", body), as_numpy)

    def rerank(
        self, query: str, documents: Sequence[str], model: str | None = None, top_n: int | None = None,
        return_documents: bool = False,
    ) -> list[RerankResult]:  # fmt: skip
        """The documents by relevance to the query, most relevant first."""
        body = self._calls.rerank_body(query, documents, model, top_n, return_documents)
        return self._calls.ranking(self._post("/v2/rerank", body))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _post(self, path: str, body: dict) -> dict:
        attempts = _Attempts(self._calls)
        while True:
            try:
                response = self._http.post(
                    self._calls.base_url + path, json=body, headers=self._calls.headers
                )
            except httpx.TransportError as error:
                delay = attempts.after_error(error)
            else:
                delay = attempts.after(response)
                if delay is None:
                    return response.json()
            time.sleep(delay)


class AsyncClient:
    """The same for asyncio: `async with AsyncClient(base_url) as client: await client.embed([...])`."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        on_retry: RetryHook | None = None,
        http: httpx.AsyncClient | None = None,
    ):
        self._calls = _Calls(base_url, api_key, retry, on_retry)
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._owns_http = http is None

    async def embed(
        self, texts: Sequence[str], model: str | None = None, dimensions: int | None = None,
        as_numpy: bool = False, **extra: Any,
    ) -> np.ndarray | list[list[float]]:  # fmt: skip
        body = self._calls.embeddings_body(texts, model, dimensions, **extra)
        return self._calls.embeddings(await self._post("/v1/embeddings", body), as_numpy)

    async def rerank(
        self, query: str, documents: Sequence[str], model: str | None = None, top_n: int | None = None,
        return_documents: bool = False,
    ) -> list[RerankResult]:  # fmt: skip
        body = self._calls.rerank_body(query, documents, model, top_n, return_documents)
        return self._calls.ranking(await self._post("/v2/rerank", body))

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _post(self, path: str, body: dict) -> dict:
        attempts = _Attempts(self._calls)
        while True:
            try:
                response = await self._http.post(
                    self._calls.base_url + path, json=body, headers=self._calls.headers
                )
            except httpx.TransportError as error:
                delay = attempts.after_error(error)
            else:
                delay = attempts.after(response)
                if delay is None:
                    return response.json()
            await asyncio.sleep(delay)
