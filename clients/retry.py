"""RetryPolicy: which answers are tried again and after how long. A 429 or 503 waits what its
Retry-After header says (seconds, or an HTTP date), else an exponential backoff; a connection error
backs off the same way (embeddings and rerank change nothing on the server, so a resend is safe)."""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass

RETRIED_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 3
    backoff_s: float = 0.5  # the first wait without Retry-After; doubled at each retry
    max_wait_s: float = 60.0  # no single wait is longer, whatever Retry-After asks

    def delay(self, attempt: int, status_code: int | None, retry_after: str | None) -> float | None:
        """Seconds to wait before retry number `attempt` (1, 2, ...) of an answer with `status_code`
        (None: the connection failed), or None: do not retry."""
        if attempt > self.max_retries:
            return None
        if status_code is not None and status_code not in RETRIED_STATUSES:
            return None
        asked = parse_retry_after(retry_after)
        wait = asked if asked is not None else self.backoff_s * 2 ** (attempt - 1)
        return min(wait, self.max_wait_s)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
