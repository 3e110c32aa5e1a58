"""RequestHooks: what every request goes through before and after its route, in Litestar's hooks and on
the hot routes alike: its arrival time, the API key, and on the response's start the x-request-id and
timing headers, the request's metrics and the gateway's AnswerTime."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable

from litestar.types import Scope

from api.errors import REFUSAL, Unauthorized, request_id_of
from api.loop_lag import LoopLag
from api.metrics import Metrics
from api.refusals import Refusals
from api.timing import TIMES, AnswerTime, RequestTimes

# the scope's state key of when the connection's protocol read a request's first bytes
# (api/connection_limits.py); without it (an app driven directly) the hooks' own time
RECEIVED = "posy_received"

# every other route needs the API key when one is set, /metrics and /openapi.json included
OPEN_PATHS = ("/health", "/ready")
Headers = list[tuple[bytes, bytes]]


class RequestHooks:
    def __init__(self, api_key: str | None, metrics: Metrics, estimates: Callable[[], str] = lambda: ""):
        """`estimates`: what admission judges the models' work on now, in words (Server's)."""
        # headers arrive as latin-1 text in Litestar, as bytes here: compared as the key's UTF-8 bytes
        self.api_key = api_key.encode() if api_key else None
        self.metrics = metrics
        self.answer_time = AnswerTime()
        self.loop_lag = LoopLag()  # beats while the app's lifespan runs
        self.refusals = Refusals(self._estimates(estimates))
        metrics.admission.gateway = lambda: (self.answer_time.reserve_s(), self.loop_lag.worst_s)

    def start(self) -> None:
        """On the serving loop, while the app's lifespan runs: the loop's heartbeat, the refusals' log."""
        self.loop_lag.start()
        self.refusals.start()

    def stop(self) -> None:
        self.loop_lag.stop()
        self.refusals.stop()

    def _estimates(self, models: Callable[[], str]) -> Callable[[], str]:
        def described() -> str:
            gateway = (
                f"answer reserve {self.answer_time.reserve_s() * 1e3:.1f} ms, event-loop lag "
                f"{self.loop_lag.worst_s * 1e3:.1f} ms"
            )
            return f"{models()}; {gateway}"

        return described

    def arrived(self, scope: Scope) -> None:
        """The request's clock starts where its first bytes were read; without a valid key (where one is
        set) it goes no further."""
        state = scope["state"]
        received = state.get(RECEIVED) or time.perf_counter()
        unseen = self.loop_lag.unseen_s(received)
        # what the gateway keeps for its answer: what answers took lately, or what its loop lags by now
        reserve = max(self.answer_time.reserve_s(received), self.loop_lag.worst_s)
        state[TIMES] = RequestTimes(received, reserve, unseen)
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            if not hmac.compare_digest(_given_key(scope["headers"]), self.api_key):
                raise Unauthorized("a valid API key is required (Authorization: Bearer KEY)")

    def response_headers(self, scope: Scope) -> Headers:
        """The headers every response adds to its own (none of them is a handler's: appended, not looked
        up); the request's total time stops here."""
        headers = [(b"x-request-id", request_id_of(scope).encode("latin-1"))]
        times: RequestTimes | None = scope["state"].get(TIMES)
        if times is not None:  # None: refused before the hooks ran (an unknown route, a body too large)
            times.answered = time.perf_counter()
            headers += times.headers(times.answered - times.arrived)
        return headers

    def observe(self, scope: Scope, status: int, route: str) -> None:
        """The answered request in the metrics, under `route` (after response_headers)."""
        refusal = scope["state"].get(REFUSAL)
        if refusal is not None:
            self.metrics.count_refusal(route, status, refusal)
            self.refusals.count(refusal, status)
        times: RequestTimes | None = scope["state"].get(TIMES)
        if times is None or times.answered is None:
            self.metrics.observe_request(route, status, 0.0)
            return
        self.metrics.observe_request(route, status, times.answered - times.arrived, times.stages())
        answer_s = times.answer_s()
        if answer_s is not None:
            self.answer_time.observe(answer_s)


def _given_key(headers: Headers) -> bytes:
    """The key of `Authorization: Bearer KEY` (the scheme in any case), else of `x-api-key: KEY`."""
    authorization = api_key = b""
    for name, value in headers:
        if name == b"authorization" and not authorization:
            authorization = value
        elif name == b"x-api-key" and not api_key:
            api_key = value
    scheme, _, key = authorization.strip().partition(b" ")
    if scheme.lower() == b"bearer":
        return key.strip()
    return api_key
