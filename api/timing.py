"""RequestTimes: where one request's time went, as text-embeddings-inference reports it: response headers
x-total-time, x-tokenization-time, x-queue-time and x-inference-time (milliseconds) and server-timing."""

from __future__ import annotations

import time
from dataclasses import dataclass

from litestar.types import Scope

# the scope's state key of a request's RequestTimes, set when it arrives
TIMES = "posy_times"
STAGES = ("tokenization", "queue", "inference")


@dataclass(slots=True)
class RequestTimes:
    arrived: float  # time.perf_counter()
    answered: float | None = None  # when its response started
    tokenization_s: float | None = None
    queue_s: float | None = None  # of the model's work: the slowest chunk's where a request was split
    inference_s: float | None = None

    def add_tokenization(self, seconds: float) -> None:
        self.tokenization_s = seconds + (self.tokenization_s or 0.0)

    def add_engine(self, queue_s: float, inference_s: float) -> None:
        """One engine call's stages; a request that calls the engine more than once (vLLM's /score with
        several queries) calls it for all at once, and waits as long as the slowest call."""
        self.queue_s = max(queue_s, self.queue_s or 0.0)
        self.inference_s = max(inference_s, self.inference_s or 0.0)

    def stages(self) -> tuple[tuple[str, float], ...]:
        """(stage, seconds) of the stages this request went through."""
        return tuple(
            (stage, seconds)
            for stage, seconds in zip(STAGES, (self.tokenization_s, self.queue_s, self.inference_s))
            if seconds is not None
        )

    def headers(self, total_s: float) -> list[tuple[bytes, bytes]]:
        stages = (("total", total_s), *self.stages())
        headers = [
            (f"x-{stage}-time".encode(), f"{1000 * seconds:.3f}".encode()) for stage, seconds in stages
        ]
        timing = ", ".join(f"{stage};dur={1000 * seconds:.3f}" for stage, seconds in stages)
        headers.append((b"server-timing", timing.encode()))
        return headers


def times_of(scope: Scope) -> RequestTimes:
    """The request's RequestTimes (one that starts now where the app's hook has not run: tests that
    call a route's pieces directly)."""
    state = scope.setdefault("state", {})
    times = state.get(TIMES)
    if times is None:
        times = state[TIMES] = RequestTimes(time.perf_counter())
    return times
