"""LoopLag: how late this gateway's event loop runs what is due, measured by a heartbeat. A request's
bytes can wait that long in the kernel, unread, before its arrival is stamped: under a flood of clients
the loop works through a backlog of connections (and on a host with other work its process waits for a
core), and a request answered "in time" by the gateway's clock reached its client seconds late.
Admission counts that wait in the request's deadline (RequestTimes.unseen_s)."""

from __future__ import annotations

import asyncio
import time
from collections import deque

BEAT_S = 0.05
# the beats whose worst lag counts: the last second's
NUM_BEATS = 20


class LoopLag:
    __slots__ = ("_lags", "_due", "_worst", "_handle", "_loop")

    def __init__(self) -> None:
        self._lags: deque[float] = deque(maxlen=NUM_BEATS)
        self._due: float | None = None  # time.perf_counter() at which the next beat is due
        self._worst = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Beat on the running loop until stop()."""
        self._loop = asyncio.get_running_loop()
        self._schedule(time.perf_counter())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._due = None

    def _schedule(self, now: float) -> None:
        self._due = now + BEAT_S
        self._handle = self._loop.call_later(BEAT_S, self._beat)

    def _beat(self) -> None:
        now = time.perf_counter()
        self._lags.append(max(0.0, now - self._due))
        self._worst = max(self._lags)
        self._schedule(now)

    def unseen_s(self, now: float) -> float:
        """How long bytes that the loop reads at `now` may have waited unread: the worst lag of the last
        second's beats, or the current beat's, if it is overdue by more."""
        due = self._due
        return self._worst if due is None else max(self._worst, now - due)

    @property
    def worst_s(self) -> float:
        """The worst lag of the last second's beats (for /metrics)."""
        return self._worst
