"""Admission by time: the one rule by which posy refuses work for its --request-timeout.

A request's work is estimated at the measured rates, its own (`own_s`) and what is queued ahead of it
(`ahead_s`), and stretched by the margin: how far admitted work overran its estimates on this host
(engine/service_rate.py). It is admitted while that fits ADMIT_SHARE of the time its deadline leaves.

- Work whose own estimate, at the rate an idle engine measures and stretched alike, does not fit
  ADMIT_SHARE of the whole timeout is refused for good (NeverInTime: 400, TEI 413): no retry passes.
- The rest is refused for now (BehindDeadline: 429), with a Retry-After by which the work ahead has
  drained enough for a retry to fit: on an idle server it fits.
- A large input's tokenization is judged alike, with TOKENIZE_SHARE of what the engine's estimate
  leaves (api/guard.py).
- Admitted work that the host slowed is set aside with a 429 before it runs, or between its batches, once
  it could no longer finish in time; a batch never takes more than BATCH_SHARE of the time its earliest
  deadline leaves (engine/scheduler.py).

"""

from __future__ import annotations

import math

from engine.errors import BehindDeadline

# admitted work must finish inside its deadline: the estimate may take this share of the time left, the
# rest covers the rate's drift between batches
ADMIT_SHARE = 0.9
# a large input's tokenization (its wait on the encoder's threads and its own time) may take this share of
# what the engine's estimate leaves of ADMIT_SHARE; its parts may start as late as the whole of it allows:
# the rest absorbs the estimate's error (the threads' rate drifts with what else runs on the host), so
# that an admitted part is rarely refused as it starts
TOKENIZE_SHARE = 0.5
# a batch's rows all come back at its end, and the engine can judge its requests again only between
# batches: a batch takes at most this share of the time that the earliest deadline in it leaves, so that a
# host that slows under it still gives its rows back in time (the first batch of a burst on two CPU cores
# shared with another process ran 3.1 times its estimate), and the next batch is judged on the rate it
# measured
BATCH_SHARE = 1 / 4


def stretched(own_s: float, ahead_s: float, margin: float) -> float:
    """The estimate admission judges: own and ahead, stretched by the margin."""
    return (own_s + ahead_s) * margin


def fits_alone(own_s: float, whole_s: float) -> bool:
    """Whether work of `own_s` (stretched) on an idle server fits what a request of `whole_s` gives it."""
    return own_s <= ADMIT_SHARE * whole_s


def admit(own_s: float, ahead_s: float, margin: float, left_s: float, whole_s: float) -> float:
    """The stretched estimate of work judged with `left_s` to its deadline; BehindDeadline where it does not
    fit ADMIT_SHARE of that, with the Retry-After after which a retry with `whole_s` fits."""
    estimate = stretched(own_s, ahead_s, margin)
    if estimate > ADMIT_SHARE * left_s:
        raise BehindDeadline(estimate, left_s, retry_after(own_s, ahead_s, margin, whole_s))
    return estimate


def retry_after(own_s: float, ahead_s: float, margin: float, whole_s: float) -> int:
    """Whole seconds (at least 1) after which the work ahead, draining at its real rate, leaves a retry
    with `whole_s` room for `own_s` (both unstretched)."""
    room = max(0.0, ADMIT_SHARE * whole_s / margin - own_s)  # what may be ahead of it then
    return max(1, math.ceil(ahead_s - room))
