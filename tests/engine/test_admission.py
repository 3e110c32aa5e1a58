"""Admission by time, with a stand-in model of known speed (a step sleeps 0.1 ms a token): the engine
measures its rate, refuses (BehindDeadline, with Retry-After from its estimate) work that the queue
could not finish before the request's deadline, admits what it can, and what it admits finishes in time;
estimates are stretched by how far admitted requests overran theirs, cautiously until it has seen some."""

import asyncio
import time

import pytest

from engine.admission import ADMIT_SHARE, BATCH_SHARE
from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import BehindDeadline
from engine.scheduler import QueuedRequest, Scheduler
from engine.service_rate import MAX_MARGIN, MIN_CHECKED, ServiceRate
from tests.conftest import TimedRunner

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

SECONDS_PER_TOKEN = 1e-4
CONFIG = EngineConfig(max_batch_tokens=1000, max_queue_tokens=10**6)


def test_the_rate_is_measured_on_large_enough_batches_only():
    rate = ServiceRate(max_batch_tokens=1000)
    rate.observe(10, 0.05)  # a small batch: its time is the step's fixed cost
    assert rate.seconds_for(100) is None
    rate.observe(500, 0.05)
    rate.observe(1000, 0.1)
    assert rate.seconds_per_token == pytest.approx(1e-4)
    assert rate.seconds_for(2000) == pytest.approx(0.2)
    rate.busy_since = time.perf_counter()  # a batch just launched comes first, as long as the last one
    assert rate.seconds_for(2000) == pytest.approx(0.3, abs=0.01)
    rate.busy_since = time.perf_counter() - 0.06  # ... and of one launched 60 ms ago, what is left
    assert rate.seconds_for(2000) == pytest.approx(0.24, abs=0.01)


def test_work_that_cannot_finish_before_its_deadline_is_refused_and_admitted_work_finishes():
    engine = Engine(
        TimedRunner(SECONDS_PER_TOKEN), EngineConfig(max_batch_tokens=1000, max_queue_tokens=10**6)
    )
    engine.start()

    async def main():
        await engine.run([[1] * 1000])  # measured: about 0.1 s a batch of 1,000 tokens
        assert engine.rate.seconds_per_token == pytest.approx(SECONDS_PER_TOKEN, rel=0.5)
        # 20,000 tokens queued (about 2 s), then requests with 1 s left: refused, whole
        deadline = time.perf_counter() + 1.0
        queued = engine.enqueue([[1] * 1000] * 20)
        with pytest.raises(BehindDeadline) as refused:
            engine.enqueue([[1] * 1000], None, deadline)
        assert refused.value.retry_after_s >= 1
        assert "--request-timeout" in str(refused.value)
        # with 5 s left the same request fits behind the queue, and finishes inside its deadline
        deadline = time.perf_counter() + 5.0
        admitted = await engine.enqueue([[1] * 1000], None, deadline)
        assert time.perf_counter() < deadline
        assert admitted.queue_s > 1.0 and admitted.inference_s > 0.05  # it waited behind the queue
        await queued

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        engine.stop()


def test_before_any_measurement_work_is_admitted_by_tokens_only():
    engine = Engine(
        TimedRunner(SECONDS_PER_TOKEN), EngineConfig(max_batch_tokens=1000, max_queue_tokens=10**6)
    )
    engine.start()

    async def main():
        # nothing measured yet: the engine cannot tell, so it does not refuse for time
        output = await engine.enqueue([[1] * 10], None, time.perf_counter() + 0.001)
        assert output.rows.shape == (1, 4)
        assert engine.estimate_seconds(1000) is None  # a 10-token batch measures nothing

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        engine.stop()


def test_the_margin_is_cautious_at_first_then_what_checked_requests_overran():
    rate = ServiceRate(max_batch_tokens=1000)
    assert rate.margin == MAX_MARGIN
    assert rate.checks(1.0, 4.0) and not rate.checks(0.5, 4.0)  # a quarter of the time left, at least
    for _ in range(MIN_CHECKED - 1):
        rate.observe_request(1.0, 1.3)
    assert rate.margin == MAX_MARGIN  # too few to go by
    rate.observe_request(1.0, 1.3)
    assert rate.margin == pytest.approx(1.3)
    for _ in range(100):  # requests back sooner than estimated never shrink an estimate
        rate.observe_request(1.0, 0.5)
    assert rate.margin == 1.0
    for _ in range(10):  # a few overran by far: the quantile follows them, up to MAX_MARGIN
        rate.observe_request(1.0, 5.0)
    assert rate.margin == MAX_MARGIN


def test_the_scheduler_refuses_what_fits_only_without_the_margin():
    rate = ServiceRate(max_batch_tokens=1000)
    rate.observe(1000, 0.1)  # 0.1 ms a token
    scheduler = Scheduler(1000, 64, 10**6, rate)
    left = 1.0
    fits_alone = int(ADMIT_SHARE * left / 1e-4 / MAX_MARGIN) - 100  # tokens the margin still admits
    judged = scheduler.submit(QueuedRequest([[1] * fits_alone]), time.perf_counter() + left)
    assert judged is not None and judged[0] == pytest.approx(fits_alone * 1e-4)
    assert judged[1] == pytest.approx(left, abs=0.01)
    # 0.2 s more: inside the time left at the bare rate, not with the margin's
    with pytest.raises(BehindDeadline):
        scheduler.submit(QueuedRequest([[1] * 2000]), time.perf_counter() + left)
    for _ in range(MIN_CHECKED):
        rate.observe_request(1.0, 1.0)  # estimates held: the margin is 1
    assert scheduler.submit(QueuedRequest([[1] * 2000]), time.perf_counter() + left) is not None


def test_the_engine_checks_its_admitted_requests_against_their_estimates():
    engine = Engine(TimedRunner(SECONDS_PER_TOKEN), CONFIG)
    engine.start()

    async def main():
        await engine.run([[1] * 1000])  # measured
        assert engine.rate.margin == MAX_MARGIN
        # requests whose estimate (0.1 s) is over a quarter of their 0.3 s: checked; at a steady speed
        # they come back about when estimated, and the margin falls to about 1
        for _ in range(MIN_CHECKED + 2):
            await engine.enqueue([[1] * 1000], None, time.perf_counter() + 0.3)
        assert 1.0 <= engine.rate.margin < 1.5

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        engine.stop()


def test_the_backlog_estimate_counts_the_queue_and_the_margin():
    """What admission of a request's tokenization asks before its tokens exist: how long work of that
    size, queued now, would take behind the queue, stretched by the margin."""
    engine = Engine(TimedRunner(SECONDS_PER_TOKEN), CONFIG)
    assert engine.backlog_seconds(100) is None  # nothing measured
    engine.rate.observe(1000, 1000 * SECONDS_PER_TOKEN)
    assert engine.backlog_seconds(100) == pytest.approx(100 * SECONDS_PER_TOKEN * MAX_MARGIN)
    engine.scheduler.submit(QueuedRequest([[1] * 500]))
    assert engine.backlog_seconds(100) == pytest.approx(600 * SECONDS_PER_TOKEN * MAX_MARGIN)


def test_admitted_work_that_the_host_slowed_is_set_aside_at_the_front_not_batched():
    rate = ServiceRate(max_batch_tokens=1000)
    rate.observe(1000, 0.1)  # 0.1 ms a token
    for _ in range(MIN_CHECKED):
        rate.observe_request(1.0, 1.0)  # the margin is 1
    scheduler = Scheduler(1000, 64, 10**6, rate)
    left = 1.0
    large = QueuedRequest([[1] * 1000] * 5, owner="large")  # 0.5 s: admitted
    assert scheduler.submit(large, time.perf_counter() + left) is not None
    small = QueuedRequest([[1] * 100], owner="small")
    assert scheduler.submit(small, time.perf_counter() + left) is not None
    for _ in range(40):  # then the host slows the engine five times over
        rate.observe(1000, 0.5)
    batch = scheduler.next_batch(timeout=0)
    # the large one would now take 2.5 s of its 1 s: set aside, its tokens released; the small one runs
    assert [sequence.owner for sequence in batch] == ["small"] and scheduler.queued_tokens == 0
    [(expired, estimate, left_then)] = scheduler.take_expired()
    assert expired is large and estimate == pytest.approx(2.5, rel=1e-3) and 0.9 < left_then <= left
    assert scheduler.take_expired() == []


def test_a_batch_stops_growing_where_it_would_come_back_past_a_deadline_in_it():
    """A batch's rows all come back at its end: a request that would make it end past the earliest
    deadline of a request already in it waits for the next batch instead (on 2 CPU cores under a flood,
    the rows of a request batched with later arrivals came back past its timeout: a 504); one whose own
    work behind the batch so far would be late is set aside."""
    rate = ServiceRate(max_batch_tokens=4000)
    rate.observe(4000, 0.4)  # 0.1 ms a token
    for _ in range(MIN_CHECKED):
        rate.observe_request(1.0, 1.0)  # the margin is 1
    scheduler = Scheduler(4000, 64, 10**6, rate)
    now = time.perf_counter()
    # 0.1 s of work with 0.15 s to its deadline; then work without a deadline and work with a later one
    tight = QueuedRequest([[1] * 500, [1] * 500], owner="tight")
    relaxed = QueuedRequest([[1] * 1000], owner="relaxed")
    later = QueuedRequest([[1] * 1000] * 2, owner="later")
    assert scheduler.submit(tight, now + 0.15) is not None
    scheduler.submit(relaxed)
    scheduler.submit(later, now + 10.0)
    # with relaxed, the batch would take 0.2 s: past tight's deadline. It waits, and so does later behind it
    assert [sequence.owner for sequence in scheduler.next_batch(timeout=0)] == ["tight", "tight"]
    # without a deadline in the batch it fills up to its budget; later's own work fits its deadline
    assert [sequence.owner for sequence in scheduler.next_batch(timeout=0)] == ["relaxed", "later", "later"]
    assert scheduler.take_expired() == []
    # a request whose work would come back late behind what the batch already holds is set aside
    first = QueuedRequest([[1] * 2000], owner="first")
    short = QueuedRequest([[1] * 500], owner="short")
    scheduler.submit(first)
    assert scheduler.submit(short, time.perf_counter() + 0.3) is not None  # 0.25 s with the queue
    for _ in range(40):
        rate.observe(4000, 0.64)  # the host slowed the engine: 0.16 ms a token, 0.4 s behind first
    assert [sequence.owner for sequence in scheduler.next_batch(timeout=0)] == ["first"]
    [(expired, estimate, _)] = scheduler.take_expired()
    assert expired is short and estimate == pytest.approx(0.4, rel=1e-3)


def test_the_engine_refuses_what_it_set_aside_at_once_and_never_runs_it():
    ran: list[int] = []
    engine = Engine(TimedRunner(SECONDS_PER_TOKEN), CONFIG, on_batch=lambda tokens, _: ran.append(tokens))
    engine.start()

    async def main():
        await engine.run([[1] * 1000])  # measured: 0.1 ms a token
        for _ in range(MIN_CHECKED):
            engine.rate.observe_request(1.0, 1.0)
        ran.clear()
        ahead = engine.enqueue([[1] * 1000])
        submitted = time.perf_counter()
        late = engine.enqueue([[2] * 1000] * 3, None, submitted + 1.0)  # 0.4 s with the queue: admitted
        for _ in range(40):  # then the host slows the engine ten times, as its batches measure
            engine.rate.observe(1000, 1.0)
        with pytest.raises(BehindDeadline, match="--request-timeout"):
            await late
        assert time.perf_counter() - submitted < 1.0  # refused before its deadline, not answered late
        await ahead
        assert ran == [1000]  # the refused work never ran

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        engine.stop()


def test_a_begun_request_that_the_host_slowed_is_set_aside_between_its_batches():
    """What ran of it is spent; the rest, at the rate now measured, would come back after its deadline: a
    429 now rather than a 504 at the deadline (its bare rate: only a certain overrun drops it)."""
    rate = ServiceRate(max_batch_tokens=1000)
    rate.observe(1000, 0.1)  # 0.1 ms a token
    scheduler = Scheduler(1000, 64, 10**6, rate)
    begun = QueuedRequest([[1] * 1000] * 5, owner="begun")  # 0.5 s of its 1.5 s
    assert scheduler.submit(begun, time.perf_counter() + 1.5) is not None
    assert [sequence.owner for sequence in scheduler.next_batch(timeout=0)] == ["begun"]
    assert [sequence.owner for sequence in scheduler.next_batch(timeout=0)] == ["begun"]  # in time still
    for _ in range(40):
        rate.observe(1000, 0.5)  # then the host slows the engine five times: 1.5 s for the rest
    assert scheduler.next_batch(timeout=0) == [] and scheduler.queued_tokens == 0
    [(expired, estimate, left)] = scheduler.take_expired()
    assert expired is begun and estimate == pytest.approx(1.5, rel=1e-3) and left < 1.5


def test_a_batch_takes_at_most_its_share_of_the_time_its_earliest_deadline_leaves():
    """Its rows all come back at its end and the engine judges again only between batches: a batch
    estimated at more than BATCH_SHARE of its earliest deadline's time left stops growing, so that a host
    that slows under it (the first batch of a burst on two shared CPU cores ran 3.1 times its estimate)
    still gives its rows back in time."""
    rate = ServiceRate(max_batch_tokens=4000)
    rate.observe(4000, 0.4)  # 0.1 ms a token
    scheduler = Scheduler(4000, 64, 10**6, rate)
    now = time.perf_counter()
    for owner in ("one", "two", "three"):
        scheduler.submit(QueuedRequest([[1] * 1000], owner=owner), now + 1.0)
    # two of them: 0.2 s, within BATCH_SHARE of the 1 s left; a third would make it 0.3 s
    assert BATCH_SHARE * 1.0 < 0.3
    assert [sequence.owner for sequence in scheduler.next_batch(timeout=0)] == ["one", "two"]
    assert [sequence.owner for sequence in scheduler.next_batch(timeout=0)] == ["three"]
