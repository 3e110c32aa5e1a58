"""RequestTimes: where one request's time went, as text-embeddings-inference reports it: response headers
x-total-time, x-tokenization-time, x-queue-time and x-inference-time (milliseconds) and server-timing."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from litestar.types import Scope

from engine.service_rate import recovered

# the scope's state key of a request's RequestTimes, set when it arrives
TIMES = "posy_times"
STAGES = ("tokenization", "queue", "inference")
HEADER_NAMES = {stage: f"x-{stage}-time".encode() for stage in ("total", *STAGES)}
TIMING_NAMES = {stage: f"{stage};dur=".encode() for stage in ("total", *STAGES)}
# AnswerTime: the requests it keeps, the quantile it reserves, and how often it ranks them again
NUM_ANSWERS = 64
ANSWER_QUANTILE = 0.95
RANK_EVERY = 8


@dataclass(slots=True)
class RequestTimes:
    arrived: float  # time.perf_counter() when the gateway read its first bytes
    # of its --request-timeout, what the gateway keeps for itself once the rows are back (AnswerTime's
    # reserve when the request arrived): the engine must finish that much before the deadline
    answer_reserve_s: float = 0.0
    # how long its bytes may have waited unread before `arrived` (api/loop_lag.py): its deadline counts
    # from `origin`, so that an answer in time by the gateway's clock is in time at the client
    unseen_s: float = 0.0
    rows_back: float | None = None  # when its last rows were back, as the engine's clock counts them
    answered: float | None = None  # when its response started
    tokenization_s: float | None = None
    queue_s: float | None = None  # of the model's work: the slowest chunk's where a request was split
    inference_s: float | None = None

    @property
    def origin(self) -> float:
        """When the request is taken to have reached the host: its deadline counts from here."""
        return self.arrived - self.unseen_s

    def add_tokenization(self, seconds: float) -> None:
        self.tokenization_s = seconds + (self.tokenization_s or 0.0)

    def add_engine(self, queue_s: float, inference_s: float) -> None:
        """One engine call's stages; a request that calls the engine more than once (vLLM's /score with
        several queries) calls it for all at once, and waits as long as the slowest call."""
        self.queue_s = max(queue_s, self.queue_s or 0.0)
        self.inference_s = max(inference_s, self.inference_s or 0.0)

    def add_rows_back(self, submitted: float, queue_s: float, inference_s: float) -> None:
        """An engine call submitted at `submitted` (time.perf_counter) whose stages took these times."""
        back = submitted + queue_s + inference_s
        self.rows_back = back if self.rows_back is None else max(back, self.rows_back)

    def answer_s(self) -> float | None:
        """From its last rows being back to its response's start: the loop's lag to resume it, the hop
        from a replica, the encoding; None where the engine never ran it."""
        if self.rows_back is None or self.answered is None:
            return None
        return self.answered - self.rows_back

    def stages(self) -> tuple[tuple[str, float], ...]:
        """(stage, seconds) of the stages this request went through."""
        return tuple(
            (stage, seconds)
            for stage, seconds in zip(STAGES, (self.tokenization_s, self.queue_s, self.inference_s))
            if seconds is not None
        )

    def headers(self, total_s: float) -> list[tuple[bytes, bytes]]:
        """Byte formatting throughout: every response carries these (str f-strings cost it 15 us)."""
        headers, timing = [], []
        for stage, seconds in (("total", total_s), *self.stages()):
            milliseconds = b"%.3f" % (1000 * seconds)
            headers.append((HEADER_NAMES[stage], milliseconds))
            timing.append(TIMING_NAMES[stage] + milliseconds)
        headers.append((b"server-timing", b", ".join(timing)))
        return headers


def times_of(scope: Scope) -> RequestTimes:
    """The request's RequestTimes (one that starts now where the app's hook has not run: tests that
    call a route's pieces directly)."""
    state = scope.setdefault("state", {})
    times = state.get(TIMES)
    if times is None:
        times = state[TIMES] = RequestTimes(time.perf_counter())
    return times


class AnswerTime:
    """How long this gateway takes to answer once a request's rows are back, over its last NUM_ANSWERS
    answered requests: a loop busy with a flood of clients resumed a request a second after its rows
    came, past --request-timeout. Admission gives the engine the time left less ANSWER_QUANTILE of it
    (reserve_s), so that work admitted in time is answered in time. As the latest answer ages the reserve
    recovers toward none (engine/service_rate.py's `recovered`): a flood's slow answers do not shorten every
    request's time once it is over, with no answers coming to say so. One per gateway process."""

    __slots__ = ("_recent", "_count", "_ranked_s", "_latest_at")

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=NUM_ANSWERS)
        self._count = 0
        self._ranked_s = 0.0
        self._latest_at = 0.0

    def observe(self, seconds: float, at: float | None = None) -> None:
        self._recent.append(max(0.0, seconds))
        self._latest_at = time.perf_counter() if at is None else at
        self._count += 1
        if self._count <= RANK_EVERY or self._count % RANK_EVERY == 0:
            ranked = sorted(self._recent)
            self._ranked_s = ranked[min(len(ranked) - 1, int(ANSWER_QUANTILE * len(ranked)))]

    def reserve_s(self, now: float | None = None) -> float:
        """The reserve at `now` (time.perf_counter(); by default now)."""
        if not self._ranked_s:
            return 0.0
        return recovered(self._ranked_s, 0.0, (time.perf_counter() if now is None else now) - self._latest_at)
