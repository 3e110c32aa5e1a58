"""Refusals: the requests a gateway refused for time or load (429, 503, 504, and the 400s of work that
never fits its --request-timeout), counted by why; every SUMMARY_EVERY_S in which some came, one log line
says how many, why, and the estimates admission judged them on, so that an operator sees a stuck estimate
in the log as well as in /metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

logger = logging.getLogger(__name__)
SUMMARY_EVERY_S = 10.0


class Refusals:
    def __init__(self, estimates: Callable[[], str], every_s: float = SUMMARY_EVERY_S):
        self.estimates = estimates  # what admission judges on now, in words
        self.every_s = every_s
        self._counts: Counter[str] = Counter()
        self._since = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Summarize every every_s on the running loop until stop()."""
        self._timer = asyncio.get_running_loop().call_later(self.every_s, self._summarize)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()

    def _summarize(self) -> None:
        self.flush()
        self.start()

    def count(self, reason: str, status: int) -> None:
        """One refused request."""
        self._counts[f"{status} {reason}"] += 1

    def flush(self) -> None:
        """The summary of the refusals since the last one, if any."""
        now = time.monotonic()
        if self._counts:
            total = sum(self._counts.values())
            reasons = ", ".join(f"{count} {why}" for why, count in self._counts.most_common())
            logger.warning(
                "refused %d requests in the last %.0f s (%s); admission's estimates: %s",
                total, now - self._since, reasons, self.estimates(),
            )  # fmt: skip
        self._counts.clear()
        self._since = now
