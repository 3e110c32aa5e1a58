"""ServiceRate: how fast an engine works through queued tokens, measured on its own recent batches and, when
idle, on probes of its own, so that admission can say whether work queued now finishes before its
deadline; and how far the requests it admitted overran their estimates, which admission then allows for.
Plain Python, no torch."""

from __future__ import annotations

import math
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
# an idle engine whose batches measured it slower than its latest probe did (by more than PROBE_TOLERANCE)
# measures itself again (a probe: one batch of min_tokens) once its latest measurement is PROBE_AFTER_S old:
# batches measured on a busy host would otherwise stand, with no traffic admitted to measure again, and
# refuse for ever work that the quiet host finishes in time. A probe leaves the rate agreeing with it (it
# replaces the batches or joins them), so a busy spell costs one probe, and an engine whose batches agree
# with its probes never probes: a request that comes during a probe waits for it
PROBE_AFTER_S = 1.0
# a probe this many times faster or slower than the batches' rate replaces them (they measured another
# host than the one now); within it, it is one more observation
PROBE_TOLERANCE = 1.25
# a rate slower than the quiet host's (the fastest yet measured) halves its excess every this many seconds
# of an idle engine (ServiceRate; a MovingRate of its own: without a new observation): a probe taken during
# a flood agrees with the flood's batches, so no later probe comes, and work it judged too slow is never
# admitted to measure the quiet host again (a request that ran in 1.5 s before a flood was refused with a
# 400 for good after it)
RECOVERY_HALF_LIFE_S = 2.0


def recovered(
    value: float, reference: float | None, age_s: float, half_life_s: float = RECOVERY_HALF_LIFE_S
) -> float:
    """`value` (seconds a unit) pulled toward `reference`: its excess over it halves every `half_life_s` of
    `age_s` (the time since the latest observation)."""
    if reference is None or value <= reference:
        return value
    return reference + (value - reference) * 0.5 ** (max(0.0, age_s) / half_life_s)


class MovingRate:
    """Seconds a unit (a token, a character) over the last `window` observations: their summed seconds
    over their summed units. With a `half_life_s`, a rate slower than its reference (what the work takes
    on a quiet host: one measured so, or else the fastest observation yet) is pulled back toward it as its
    latest observation ages: its excess halves every half_life_s without a new one, so that a rate taken
    on a busy host does not outlive the busy spell when no traffic comes to measure it again. Without one,
    its owner may fold a recovery in (`recover`). Its owner serializes `add`; a read takes one tuple,
    never half an update."""

    def __init__(self, window: int, half_life_s: float | None = None):
        self._observations: deque[tuple[int, float]] = deque(maxlen=window)
        self._totals = (0, 0.0)
        self.half_life_s = half_life_s
        self.measured_reference: float | None = None  # set by its owner from a quiet host's measure
        self._fastest: float | None = None
        self.latest_at = 0.0  # time.perf_counter() of the latest observation

    def add(self, units: int, seconds: float, at: float | None = None) -> None:
        total_units, total_seconds = self._totals
        if len(self._observations) == self._observations.maxlen:
            old_units, old_seconds = self._observations[0]
            total_units, total_seconds = total_units - old_units, total_seconds - old_seconds
        self._observations.append((units, seconds))
        self._totals = (total_units + units, total_seconds + seconds)
        self.latest_at = time.perf_counter() if at is None else at
        if units and (self._fastest is None or seconds / units < self._fastest):
            self._fastest = seconds / units

    def recover(self, age_s: float) -> None:
        """Each observation as recovered toward the reference over `age_s` (RECOVERY_HALF_LIFE_S), kept: a
        new observation on the quiet host must not bring back the busy spell's before it."""
        reference = self.reference
        if reference is None or age_s <= 0 or self.measured is None or self.measured <= reference:
            return
        kept = [
            (units, recovered(seconds / units, reference, age_s) * units if units else seconds)
            for units, seconds in self._observations
        ]
        self._observations = deque(kept, maxlen=self._observations.maxlen)
        self._totals = (sum(units for units, _ in self._observations), sum(s for _, s in self._observations))

    def restart(self, units: int, seconds: float, at: float | None = None) -> None:
        """The window holds this observation only (the earlier ones measured another host)."""
        self._observations.clear()
        self._totals = (0, 0.0)
        self.add(units, seconds, at)

    @property
    def measured(self) -> float | None:
        """The window's own rate, not pulled toward the reference."""
        units, seconds = self._totals
        return seconds / units if units else None

    @property
    def reference(self) -> float | None:
        return self.measured_reference if self.measured_reference is not None else self._fastest

    @property
    def seconds_per_unit(self) -> float | None:
        measured, reference = self.measured, self.reference
        if measured is None:
            return reference
        if self.half_life_s is None:
            return measured
        return recovered(measured, reference, time.perf_counter() - self.latest_at, self.half_life_s)


class ServiceRate:
    """Seconds per token over the last NUM_BATCHES measured batches, each batch's time being how long the
    engine was busy with it: from its launch, or from the previous batch's end where batches overlap,
    to its rows being back; and the idle engine's probes (probe_due, observe_probe). None until a batch
    large enough to measure (or a probe) has run. While the engine is idle, each rate it gives recovers
    toward the quiet host's (`quiet_seconds_per_token`, by RECOVERY_HALF_LIFE_S), and the next batch's launch
    keeps what it recovered; a busy engine's rates do not recover (its next batch measures it)."""

    def __init__(self, max_batch_tokens: int):
        self.max_batch_tokens = max_batch_tokens
        self._min_tokens = max(1, int(max_batch_tokens * MIN_BATCH_SHARE))
        self._batches = MovingRate(NUM_BATCHES)
        self._last_batch_s = 0.0
        self._overruns: deque[float] = deque(maxlen=NUM_REQUESTS)
        self.margin = MAX_MARGIN  # what admission multiplies an estimate by (set by the engine's thread)
        self._lock = threading.Lock()
        # when the batch now on the device was launched (time.perf_counter); None while idle. Set by
        # the engine's thread (launched)
        self.busy_since: float | None = None
        self._busy_for: float | None = None  # how long it is expected to take; None: as the latest batch
        self.num_probes = 0
        self._idle: float | None = None  # seconds a token of the latest probe
        self._idle_since: float | None = None  # when the engine went idle (time.perf_counter); None: busy
        self._latest: float | None = None  # ... of the latest measured batch or probe

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
            self._latest = busy_s / num_tokens

    def probe_due(self, now: float) -> bool:
        """Whether an idle engine should probe now: its batches measured it slower than its latest probe
        did, and its latest measurement is PROBE_AFTER_S old."""
        measured, idle = self._batches.measured, self._idle
        if measured is None or idle is None or measured <= PROBE_TOLERANCE * idle:
            return False
        return now - self._batches.latest_at >= PROBE_AFTER_S

    def observe_probe(self, num_tokens: int, seconds: float) -> bool:
        """A probe's batch of `num_tokens` took `seconds` (the engine's thread, idle otherwise); -> whether
        it changed the rate beyond PROBE_TOLERANCE (then it replaces the batches; else it joins them)."""
        if seconds <= 0:
            return False
        with self._lock:
            measured = self._batches.measured
            ratio = math.inf if measured is None else (seconds / num_tokens) / measured
            changed = not 1 / PROBE_TOLERANCE <= ratio <= PROBE_TOLERANCE
            if changed:
                self._batches.restart(num_tokens, seconds)
            else:
                self._batches.add(num_tokens, seconds)
            self._last_batch_s = seconds
            self._idle = self._latest = seconds / num_tokens
            self.num_probes += 1
        return changed

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
        rate = self._batches.seconds_per_unit
        return None if rate is None else self._recovered(rate)

    @property
    def quiet_seconds_per_token(self) -> float | None:
        """What the quiet host takes a token: the fastest batch or probe yet."""
        return self._batches.reference

    def _recovered(self, value: float) -> float:
        """`value` as recovered over the engine's idle time so far."""
        since = self._idle_since
        if since is None:
            return value
        return recovered(value, self.quiet_seconds_per_token, time.perf_counter() - since)

    @property
    def guarded_seconds_per_token(self) -> float | None:
        """What queued work is held to its deadline on: the rate, or the latest batch's where that was slower
        (a host that slows shows in one batch, long before it moves the window's rate)."""
        rate = self.seconds_per_token
        if rate is None or self._latest is None:
            return rate
        return max(rate, self._recovered(self._latest))

    @property
    def idle_seconds_per_token(self) -> float | None:
        """What an idle engine takes a token: its latest probe's rate (before any probe, the batches')."""
        return self._recovered(self._idle) if self._idle is not None else self.seconds_per_token

    def seconds_for(self, num_tokens: int) -> float | None:
        """How long `num_tokens` queued tokens take to come back: their share of the rate, plus what is
        left of the batch on the device, if any (taken to last as long as the latest measured one);
        None before any measurement."""
        per_token = self.seconds_per_token
        if per_token is None:
            return None
        return num_tokens * per_token + self.in_flight_left()

    def launched(self, at: float | None, expected_s: float | None = None) -> None:
        """A batch went to the device at `at` (None: the engine is idle), expected to take `expected_s` (None:
        as long as the latest measured batch); a launch keeps what the idle time before it recovered."""
        self._busy_for = expected_s
        self.busy_since = at
        if at is None:
            if self._idle_since is None:
                self._idle_since = time.perf_counter()
            return
        since, self._idle_since = self._idle_since, None  # read unrecovered until the fold is done
        if since is None or at <= since:
            return
        quiet = self.quiet_seconds_per_token
        with self._lock:
            self._batches.recover(at - since)
            if self._idle is not None:
                self._idle = recovered(self._idle, quiet, at - since)
            if self._latest is not None:
                self._latest = recovered(self._latest, quiet, at - since)

    def in_flight_left(self) -> float:
        """What is left of the batch on the device (0 while idle)."""
        busy_since, busy_for = self.busy_since, self._busy_for
        if busy_since is None:
            return 0.0
        return max(
            0.0, (self._last_batch_s if busy_for is None else busy_for) - (time.perf_counter() - busy_since)
        )
