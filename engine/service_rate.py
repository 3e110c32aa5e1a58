"""ServiceRate: how fast an engine works through queued tokens, measured on its own recent batches, so
that admission can say whether work queued now finishes before its deadline; and how far the requests it
admitted overran their estimates, which admission then allows for. Plain Python, no torch."""

from __future__ import annotations

import threading
import time
from collections import deque

NUM_BATCHES = 32  # the moving window
# batches smaller than this share of max_batch_tokens are not measured: their time is mostly the fixed
# cost of a step, and a rate taken from them would refuse large work that fits
MIN_BATCH_SHARE = 1 / 8
# the admitted requests whose time is checked against the estimate they were admitted on: those whose
# estimate took at least CHECKED_SHARE of the time they had left (below it, a step's fixed cost and the
# batch on the device outweigh the rate, and the deadline hardly decided their admission)
NUM_REQUESTS = 64
CHECKED_SHARE = 0.25
# the margin: this quantile of their time over their estimate (a batch's time varies with what else runs
# on the host: the HTTP server, tokenizers, other replicas), at least 1 and at most MAX_MARGIN, so that
# requests large enough to be checked are still admitted and the margin follows the host back down
MARGIN_QUANTILE = 0.95
MAX_MARGIN = 2.0
# until this many requests were checked the margin is MAX_MARGIN: a server's first burst of requests
# (tokenized all at once, beside the engine) overran estimates the most, by 2.5 times on 2 CPU cores
MIN_CHECKED = 8


class MovingRate:
    """Seconds a unit (a token, a character) over the last `window` observations: their summed seconds
    over their summed units. Its owner serializes `add`; a read takes one tuple, never half an update."""

    def __init__(self, window: int):
        self._observations: deque[tuple[int, float]] = deque(maxlen=window)
        self._totals = (0, 0.0)

    def add(self, units: int, seconds: float) -> None:
        total_units, total_seconds = self._totals
        if len(self._observations) == self._observations.maxlen:
            old_units, old_seconds = self._observations[0]
            total_units, total_seconds = total_units - old_units, total_seconds - old_seconds
        self._observations.append((units, seconds))
        self._totals = (total_units + units, total_seconds + seconds)

    @property
    def seconds_per_unit(self) -> float | None:
        units, seconds = self._totals
        return seconds / units if units else None


class ServiceRate:
    """Seconds per token over the last NUM_BATCHES measured batches, each batch's time being how long the
    engine was busy with it: from its launch, or from the previous batch's end where batches overlap,
    to its rows being back. None until a batch large enough to measure has run."""

    def __init__(self, max_batch_tokens: int):
        self.max_batch_tokens = max_batch_tokens
        self._min_tokens = max(1, int(max_batch_tokens * MIN_BATCH_SHARE))
        self._batches = MovingRate(NUM_BATCHES)
        self._last_batch_s = 0.0
        self._overruns: deque[float] = deque(maxlen=NUM_REQUESTS)
        self.margin = MAX_MARGIN  # what admission multiplies an estimate by (set by the engine's thread)
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
            self._batches.add(num_tokens, busy_s)
            self._last_batch_s = busy_s

    @staticmethod
    def checks(estimate_s: float, left_s: float) -> bool:
        """Whether a request admitted on `estimate_s` with `left_s` to its deadline is to be checked."""
        return estimate_s >= CHECKED_SHARE * left_s

    def observe_request(self, estimate_s: float, actual_s: float) -> None:
        """A checked request is back `actual_s` after its admission on `estimate_s` (the engine's
        thread)."""
        self._overruns.append(actual_s / estimate_s)
        if len(self._overruns) < MIN_CHECKED:
            return
        ranked = sorted(self._overruns)
        quantile = ranked[min(len(ranked) - 1, int(MARGIN_QUANTILE * len(ranked)))]
        self.margin = min(MAX_MARGIN, max(1.0, quantile))

    @property
    def seconds_per_token(self) -> float | None:
        return self._batches.seconds_per_unit

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
