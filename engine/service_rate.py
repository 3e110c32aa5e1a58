"""ServiceRate: how fast an engine works through queued tokens, measured on its own recent batches, so
that admission can say whether work queued now finishes before its deadline. Plain Python, no torch."""

from __future__ import annotations

import threading
import time
from collections import deque

NUM_BATCHES = 32  # the moving window
# batches smaller than this share of max_batch_tokens are not measured: their time is mostly the fixed
# cost of a step, and a rate taken from them would refuse large work that fits
MIN_BATCH_SHARE = 1 / 8


class ServiceRate:
    """Seconds per token over the last NUM_BATCHES measured batches, each batch's time being how long the
    engine was busy with it: from its launch, or from the previous batch's end where batches overlap,
    to its rows being back. None until a batch large enough to measure has run."""

    def __init__(self, max_batch_tokens: int):
        self.max_batch_tokens = max_batch_tokens
        self._min_tokens = max(1, int(max_batch_tokens * MIN_BATCH_SHARE))
        self._batches: deque[tuple[int, float]] = deque(maxlen=NUM_BATCHES)
        self._totals = (0, 0.0)
        self._last_batch_s = 0.0
        self._lock = threading.Lock()
        # when the batch now on the device was launched (time.perf_counter); None while idle. Set by
        # the engine's thread
        self.busy_since: float | None = None

    @property
    def min_tokens(self) -> int:
        """The smallest batch it measures."""
        return self._min_tokens

    def measures(self, num_tokens: int) -> bool:
        """Whether a batch of `num_tokens` is large enough to take the rate's time per token."""
        return num_tokens >= self._min_tokens

    def observe(self, num_tokens: int, busy_s: float) -> None:
        """One finished batch (the engine's thread)."""
        if not self.measures(num_tokens) or busy_s <= 0:
            return
        with self._lock:
            tokens, seconds = self._totals
            if len(self._batches) == self._batches.maxlen:
                old_tokens, old_seconds = self._batches[0]
                tokens, seconds = tokens - old_tokens, seconds - old_seconds
            self._batches.append((num_tokens, busy_s))
            self._totals = (tokens + num_tokens, seconds + busy_s)
            self._last_batch_s = busy_s

    @property
    def seconds_per_token(self) -> float | None:
        tokens, seconds = self._totals
        return seconds / tokens if tokens else None

    def seconds_for(self, num_tokens: int) -> float | None:
        """How long `num_tokens` queued tokens take to come back: their share of the rate, plus what is
        left of the batch on the device, if any (taken to last as long as the latest measured one);
        None before any measurement."""
        per_token = self.seconds_per_token
        if per_token is None:
            return None
        busy_since = self.busy_since
        left = (
            0.0 if busy_since is None else max(0.0, self._last_batch_s - (time.perf_counter() - busy_since))
        )
        return num_tokens * per_token + left
