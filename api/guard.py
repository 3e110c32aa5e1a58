"""RequestGuard: what one HTTP request may ask of the model: a token budget, a deadline, and no work
left in the queue once its client has gone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
from litestar import Request
from litestar.types import Receive

from api.config import ServerConfig
from api.errors import ClientDisconnected, RequestTimeout, RequestTooLarge
from scoring.rerank import SequenceRunner

# the scope's state key under which the app notes when a request arrived (time.perf_counter)
ARRIVED = "posy_started"


class RequestGuard:
    """Stands in for the engine (a SequenceRunner) during one request. `run` refuses more than
    max_request_tokens before anything is queued, then waits on the engine until its rows come, the
    request's deadline passes (504) or the client disconnects (499), whichever is first. The last two
    cancel the engine's future, and the scheduler drops the request's sequences not yet batched."""

    def __init__(self, engine: SequenceRunner, request: Request, config: ServerConfig):
        self.engine = engine
        self.receive = request.receive
        self.max_request_tokens = config.max_request_tokens
        self.timeout_s = config.request_timeout
        arrived = request.scope.get("state", {}).get(ARRIVED, time.perf_counter())
        self.deadline = arrived + self.timeout_s if self.timeout_s > 0 else None

    async def run(
        self, token_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int] | None] | None = None
    ) -> np.ndarray:
        num_tokens = sum(map(len, token_ids))
        if num_tokens > self.max_request_tokens:
            raise RequestTooLarge(num_tokens, self.max_request_tokens)
        work = asyncio.ensure_future(self.engine.run(token_ids, token_type_ids))
        gone = asyncio.ensure_future(_disconnected(self.receive))
        try:
            done, _ = await asyncio.wait(
                (work, gone), timeout=self._seconds_left(), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            gone.cancel()
            work.cancel()  # a no-op once done; before, it cancels the future the scheduler checks
        if work in done:
            return work.result()
        if gone in done:
            gone.result()  # a failing receive() is a fault, not a disconnect
            raise ClientDisconnected()
        raise RequestTimeout(self.timeout_s)

    def _seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.perf_counter())


async def _disconnected(receive: Receive) -> None:
    """Returns when the server reports that the client went away. The route has read the body, so
    the next ASGI message is the disconnect (uvicorn and the test clients send it; the latter only
    once the response is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass
